/*
 * What one thread waking another costs on this machine: two threads pass a token back and
 * forth through two eventfds (the waker writes, the woken one sleeps in epoll_wait, as
 * awcp-mount's FUSE thread wakes its network thread), 20,000 round trips, and the mean
 * round trip is printed. Run it as is (the threads land where the scheduler puts them,
 * usually on two CPUs) and under `taskset -c 0` (both on one CPU) to see what crossing CPUs
 * adds. Not part of `just bench`; docs/PERFORMANCE.md quotes its numbers.
 *
 *   gcc -O2 -pthread bench/wake_pingpong.c -o /tmp/wake_pingpong
 *   /tmp/wake_pingpong; taskset -c 0 /tmp/wake_pingpong
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 20000 };
static int ping, pong;

static void *responder(void *unused) {
    (void)unused;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, ping, &ev);
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t v;
        epoll_wait(ep, &ev, 1, -1);
        if (read(ping, &v, sizeof v) != sizeof v || write(pong, &v, sizeof v) != sizeof v)
            return NULL;
    }
    return NULL;
}

int main(void) {
    ping = eventfd(0, 0);
    pong = eventfd(0, 0);
    pthread_t t;
    pthread_create(&t, NULL, responder, NULL);
    struct timespec a, b;
    uint64_t v = 1;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < ROUNDS; i++) {
        if (write(ping, &v, sizeof v) != sizeof v || read(pong, &v, sizeof v) != sizeof v)
            return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("round trip (two wake-ups): %.2f us\n", ns / ROUNDS / 1000.0);
    return 0;
}

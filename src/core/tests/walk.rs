//! Listings fetched ahead of a walk down the tree (`core::walk_ahead`).

use super::*;

/// What the kernel does for `ls -R` in one directory: open it, read it with readdirplus (one
/// lookup reference per entry), close it. Returns the subdirectories and every name seen.
async fn list_plus(h: &Harness, dir: Ino) -> (Vec<(OsString, Ino)>, Vec<OsString>) {
    let dh = h.fs.opendir(dir).await.unwrap();
    let items = h.fs.readdir(dh, 0).await.unwrap();
    let (mut subdirs, mut names) = (Vec::new(), Vec::new());
    for item in items.iter().filter(|i| i.attrs.is_some()) {
        let e = h.fs.readdirplus_entry(dir, item).await.unwrap();
        names.push(item.name.clone());
        if e.attr.kind == FileKind::Dir {
            subdirs.push((item.name.clone(), e.attr.ino));
        }
    }
    h.fs.releasedir(dh);
    names.sort();
    (subdirs, names)
}

/// `ls -R` below `dir`, depth first: every path seen (relative to `dir`), sorted.
async fn walk_down(h: &Harness, dir: Ino) -> Vec<String> {
    let mut seen = Vec::new();
    let mut stack = vec![(String::new(), dir)];
    while let Some((at, ino)) = stack.pop() {
        let (subdirs, names) = list_plus(h, ino).await;
        seen.extend(names.iter().map(|n| format!("{at}{}", n.to_string_lossy())));
        for (name, sub) in subdirs.into_iter().rev() {
            stack.push((format!("{at}{}/", name.to_string_lossy()), sub));
        }
    }
    seen.sort();
    seen
}

fn walked_ahead(h: &Harness) -> u64 {
    h.fs.stats.dirs_listed_ahead.load(Ordering::Relaxed)
}

/// A harness whose walks do not depend on how fast the test runs (two steps down are one
/// descent however long apart).
fn walk_harness(ttls: CacheConfig) -> Harness {
    let h = Harness::with(config(ttls), None);
    h.fs.walk.set_descent_gap(Duration::from_secs(3600));
    h
}

/// The subdirectory `name` of a `list_plus` result.
fn sub(subdirs: &[(OsString, Ino)], name: &str) -> Ino {
    subdirs.iter().find(|(n, _)| n == name).unwrap().1
}

/// Go down two levels from `top` as `ls -R` does: list `top`, list its subdirectory `first`,
/// open that one's subdirectory `second` (the second step down starts the walk).
async fn descend(h: &Harness, top: Ino, first: &str, second: &str) {
    let (subdirs, _) = list_plus(h, top).await;
    let (subdirs, _) = list_plus(h, sub(&subdirs, first)).await;
    let dh = h.fs.opendir(sub(&subdirs, second)).await.unwrap();
    h.fs.releasedir(dh);
}

/// `top/{a,b}/{c,d}/e/file`: 2 + 4 + 4 directories below `top`.
fn make_tree(h: &Harness) {
    for x in ["a", "b"] {
        for y in ["c", "d"] {
            std::fs::create_dir_all(h.disk(format!("top/{x}/{y}/e"))).unwrap();
            std::fs::write(h.disk(format!("top/{x}/{y}/e/file")), x).unwrap();
        }
    }
}

/// A tool going down two levels lists the whole tree below where it started in the
/// background, by path: the rest of the walk needs no round trip, and shows what is on the
/// server. With listings not cached, nothing is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_down_finds_the_tree_below_listed_ahead() {
    for cached in [true, false] {
        let ttls = long_ttls_listings(cached);
        let h = walk_harness(ttls);
        make_tree(&h);
        let top = h.lookup(ROOT, "top").await;
        descend(&h, top, "a", "c").await;
        if !cached {
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(walked_ahead(&h), 0, "walked ahead without a listing cache");
            continue;
        }
        // a, b, a/c and a/d have inodes (listed as readdirplus handed them); the 6 others
        // below top do not.
        eventually("the tree below listed ahead", || walked_ahead(&h) == 6).await;
        h.plan.reset_counts();
        let seen = walk_down(&h, top).await;
        assert_eq!(
            h.plan.call_counts(),
            std::collections::HashMap::new(),
            "the walk reached the server"
        );
        let mut want = Vec::new();
        for x in ["a", "b"] {
            want.push(x.to_string());
            for y in ["c", "d"] {
                want.push(format!("{x}/{y}"));
                want.push(format!("{x}/{y}/e"));
                want.push(format!("{x}/{y}/e/file"));
            }
        }
        want.sort();
        assert_eq!(seen, want);
    }
}

/// One step down (`ls top`, then `ls top/a`, as a person browses) lists nothing ahead
/// beyond the subdirectories handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_step_down_lists_nothing_ahead() {
    let h = walk_harness(long_ttls());
    make_tree(&h);
    let top = h.lookup(ROOT, "top").await;
    let (subdirs, _) = list_plus(&h, top).await;
    list_plus(&h, sub(&subdirs, "a")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(walked_ahead(&h), 0);
}

/// Wait until `n` listings were asked for and none is on its way any more (a hold set after
/// this catches only what comes next).
async fn listings_done(h: &Harness, n: u64) {
    eventually("listings done", || {
        h.plan.calls(ROp::ReadDir) == n && h.fs.listings_in_flight.lock().unwrap().is_empty()
    })
    .await;
}

/// A tree being changed through the mount (`cp -r` into it, `rm -rf`) is not walked ahead:
/// each change would drop what the walk listed by path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_walk_starts_while_names_change() {
    let h = walk_harness(long_ttls());
    make_tree(&h);
    let top = h.lookup(ROOT, "top").await;
    h.mkdir(top, "new").await;
    descend(&h, top, "a", "c").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(walked_ahead(&h), 0);
}

/// `t/x/y` to go down through, and two trees `t/b/c` and `t/other/c` to swap by renames.
fn make_swap_tree(h: &Harness) {
    std::fs::create_dir_all(h.disk("t/x/y")).unwrap();
    std::fs::create_dir_all(h.disk("t/b/c")).unwrap();
    std::fs::write(h.disk("t/b/c/was-b"), b"").unwrap();
    std::fs::create_dir_all(h.disk("t/other/c")).unwrap();
    std::fs::write(h.disk("t/other/c/was-other"), b"").unwrap();
}

/// A listing fetched ahead by path must not outlive a name change through the mount: after
/// `t/b` is renamed away and `t/other` renamed to `t/b`, `t/b/c` is the other tree's `c`,
/// not the one listed ahead under that path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_through_the_mount_drops_the_listings_walked_ahead() {
    let h = walk_harness(long_ttls());
    make_swap_tree(&h);
    let t = h.lookup(ROOT, "t").await;
    descend(&h, t, "x", "y").await;
    eventually("both c listed ahead", || walked_ahead(&h) == 2).await;
    h.fs.rename(t, os("b"), t, os("old"), 0).await.unwrap();
    h.fs.rename(t, os("other"), t, os("b"), 0).await.unwrap();
    let b = h.lookup(t, "b").await;
    let c = h.lookup(b, "c").await;
    assert_eq!(
        readdir_names(&h, c).await,
        [os("."), os(".."), os("was-other")]
    );
}

/// The same renames while the walk's listing of `t/b/c` is still on its way: the lookup that
/// joined it must not be given it (it shows `t/b/c` from before the renames).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_while_a_walk_lists_ahead_is_not_hidden_by_it() {
    let h = walk_harness(long_ttls());
    make_swap_tree(&h);
    let t = h.lookup(ROOT, "t").await;
    let (subdirs, _) = list_plus(&h, t).await;
    let (subdirs, _) = list_plus(&h, sub(&subdirs, "x")).await;
    // t, x, b, other and y listed.
    listings_done(&h, 5).await;
    // Listed by the server before the renames, answered after them.
    h.plan.hold_replies(ROp::ReadDir);
    let dh = h.fs.opendir(sub(&subdirs, "y")).await.unwrap();
    h.fs.releasedir(dh);
    // The server has listed t/b/c and t/other/c for the walk; the answers are on their way.
    h.plan.until_held(ROp::ReadDir, 2).await;
    h.fs.rename(t, os("b"), t, os("old"), 0).await.unwrap();
    h.fs.rename(t, os("other"), t, os("b"), 0).await.unwrap();
    let b = h.lookup(t, "b").await;
    let c = h.lookup(b, "c").await;
    let fs = h.fs.clone();
    let names = tokio::spawn(async move {
        let dh = fs.opendir(c).await.unwrap();
        let names: Vec<OsString> = fs
            .readdir(dh, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        fs.releasedir(dh);
        names
    });
    // The map, the walk's task and its clean-up hold the listing on its way; a fourth holder
    // is the opendir (or the prefetch it shares) joining it.
    let c_path = h.root.join("t/b/c");
    eventually("the opendir joined the walk's listing", || {
        h.fs.walk.holders(&c_path) >= 4
    })
    .await;
    h.plan.release(ROp::ReadDir);
    assert_eq!(names.await.unwrap(), [os("."), os(".."), os("was-other")]);
    // The walk stopped at the renames; nothing it had on its way is left behind.
    eventually("no listing left on its way", || {
        h.fs.walk.in_flight_count() == 0
    })
    .await;
}

/// A lookup in a directory whose listing a walk is fetching by path waits for that listing
/// instead of asking the server again (no second READDIR, no LSTAT of the name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_joins_a_listing_walked_ahead_on_its_way() {
    let h = walk_harness(long_ttls());
    std::fs::create_dir_all(h.disk("top/a/c")).unwrap();
    std::fs::create_dir_all(h.disk("top/x/y")).unwrap();
    for i in 0..5 {
        std::fs::write(h.disk(format!("top/a/c/f{i}")), b"x").unwrap();
    }
    let top = h.lookup(ROOT, "top").await;
    let (subdirs, _) = list_plus(&h, top).await;
    let a = sub(&subdirs, "a");
    let (xs, _) = list_plus(&h, sub(&subdirs, "x")).await;
    // top, a, x and y listed.
    listings_done(&h, 4).await;
    h.plan.reset_counts();
    h.plan.hold(ROp::ReadDir);
    let dh = h.fs.opendir(sub(&xs, "y")).await.unwrap();
    h.fs.releasedir(dh);
    // The walk's listing of top/a/c is at the server's door.
    h.plan.until_held(ROp::ReadDir, 1).await;
    let fs = h.fs.clone();
    let lookups = tokio::spawn(async move {
        let c = fs.lookup(a, os("c")).await.unwrap().attr.ino;
        fs.lookup(c, os("f3")).await.unwrap().attr.size
    });
    let c_path = h.root.join("top/a/c");
    eventually("the lookups joined the walk's listing", || {
        h.fs.walk.holders(&c_path) >= 4
    })
    .await;
    h.plan.release(ROp::ReadDir);
    assert_eq!(lookups.await.unwrap(), 1);
    assert_eq!(h.plan.calls(ROp::ReadDir), 1, "listed twice");
    assert_eq!(h.plan.calls(ROp::Lstat), 0, "looked up by name");
}

/// A walk lists at most `MAX_WALK_LISTINGS` directories ahead, however large the tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_ahead_is_bounded() {
    let h = walk_harness(long_ttls());
    let max = super::super::walk_ahead::MAX_WALK_LISTINGS;
    for i in 0..max + 40 {
        std::fs::create_dir_all(h.disk(format!("top/x/y/d{i}"))).unwrap();
    }
    let top = h.lookup(ROOT, "top").await;
    descend(&h, top, "x", "y").await;
    // (Two listings of the budget are x's and y's, for their inodes: not by path.)
    let by_path = max as u64 - 2;
    eventually("the walk's budget spent", || walked_ahead(&h) == by_path).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(walked_ahead(&h), by_path);
}

/// While a tool reads through a tree (`grep -r`, `cp -r`), a subdirectory handed to it gets its
/// first small files fetched before the tool goes in: the first opens there need no round
/// trip. Before the tool reads files one after another, handing a directory fetches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_reading_through_a_tree_finds_the_next_directorys_first_files_fetched() {
    let h = Harness::new();
    h.fs.small_files
        .set_reading_window(Duration::from_secs(3600));
    std::fs::create_dir_all(h.disk("top/sub")).unwrap();
    std::fs::create_dir_all(h.disk("quiet/sub")).unwrap();
    for i in 0..3 {
        // One file per directory: reading them fetches nothing else ahead.
        std::fs::create_dir_all(h.disk(format!("r{i}"))).unwrap();
        std::fs::write(h.disk(format!("r{i}/a")), pattern(10 + i)).unwrap();
    }
    for i in 0..6 {
        std::fs::write(h.disk(format!("top/sub/g{i}")), pattern(20 + i)).unwrap();
        std::fs::write(h.disk(format!("quiet/sub/g{i}")), pattern(20 + i)).unwrap();
    }
    let quiet = h.lookup(ROOT, "quiet").await;
    list_plus(&h, quiet).await;
    // quiet and quiet/sub listed (sub by its prefetch), with no tool reading: no file.
    eventually("quiet/sub listed", || h.plan.calls(ROp::ReadDir) == 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.plan.calls(ROp::Open), 0, "fetched with no tool reading");

    // Three files read one after another: a tool is reading through the tree.
    for i in 0..3 {
        let r = h.lookup(ROOT, format!("r{i}")).await;
        let a = h.lookup(r, "a").await;
        assert_eq!(cat(&h, a).await, pattern(10 + i));
    }
    assert_eq!(h.plan.calls(ROp::Open), 3);
    let top = h.lookup(ROOT, "top").await;
    list_plus(&h, top).await;
    let first = super::super::prefetch::FIRST_FILES_AHEAD;
    wait_for_opens(&h, 3 + first as u64).await;
    let before = h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed);
    let sub = h.lookup(top, "sub").await;
    // The first files in the order the directory is listed, as grep -r and cp -r read it.
    let listed: Vec<String> = std::fs::read_dir(h.disk("top/sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for name in &listed[..first] {
        let g = h.lookup(sub, name).await;
        let i: usize = name[1..].parse().unwrap();
        assert_eq!(cat(&h, g).await, pattern(20 + i), "{name}");
    }
    assert_eq!(
        h.fs.stats.opens_fetched_ahead.load(Ordering::Relaxed) - before,
        first as u64,
        "an open of the first files went to the server"
    );
}

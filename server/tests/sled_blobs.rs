//! sled's files for large values do not pile up as the values are replaced.
//!
//! sled 0.34 removes the file of a replaced value (here, a leaf of 1 MiB values) once its log
//! has moved past the segment that replaced it, which the store's flush brings about after
//! enough churn (`SledStore::close_segments`). When a file goes depends on sled's page
//! consolidation and on the epochs of its memory reclamation, so a replaced file can stay
//! for a closing or two; what must not happen is that every generation's files stay.

use neardup_server::storage::{SledStore, Store};

#[test]
fn replaced_large_values_do_not_pile_up() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), 1 << 20).unwrap();
    let s = store.space("runs").unwrap();
    let blob_bytes = || -> u64 {
        std::fs::read_dir(dir.path().join("blobs"))
            // A file sled removes between the listing and its metadata counts as gone.
            .map(|d| d.flatten().map(|f| f.metadata().map_or(0, |m| m.len())).sum())
            .unwrap_or(0)
    };
    // Generations of eight 1 MiB chunks, each replacing the one before, as merges do.
    const GENERATIONS: u8 = 16;
    let chunk = |g: u8, c: u8| vec![g ^ c; 1 << 20];
    let live = 8u64 << 20;
    let mut most = 0;
    for g in 0..GENERATIONS {
        for c in 0..8u8 {
            s.put(&[g, c], &chunk(g, c)).unwrap();
        }
        if g > 0 {
            s.remove_range(&[g - 1], &[g]).unwrap();
        }
        store.sync().unwrap();
        most = most.max(blob_bytes());
    }
    // sled alone keeps every generation's files: 50 times the live data here. With the
    // segments closed, a few generations' files may wait at once (at most 2.8-4.4x in
    // runs here), no more.
    println!("blob files at most {:.1}x the live data", most as f64 / live as f64);
    assert!(most < 8 * live, "{most} bytes of blob files for {live} live");
    drop((s, store));
    let store = SledStore::open(dir.path(), 1 << 20).unwrap();
    let s = store.space("runs").unwrap();
    let last = GENERATIONS - 1;
    for c in 0..8u8 {
        assert_eq!(s.get(&[last, c]).unwrap().unwrap(), chunk(last, c), "chunk {c}");
    }
    assert!(s.get(&[last - 1, 0]).unwrap().is_none());
}

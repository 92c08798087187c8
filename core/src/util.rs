//! Small helpers shared by the modules and by tests and benchmarks: Hamming distance and a
//! seeded random generator (so test data and benchmark workloads are reproducible without a
//! dependency); inside the crate, the radix sorts that build runs and tables, and memory
//! hints (prefetches, huge pages).

/// Hamming distance between two 64-bit fingerprints.
#[inline(always)]
pub fn hamming(a: u64, b: u64) -> u32 {
    (a ^ b).count_ones()
}

/// SplitMix64: a tiny, fast, seeded generator (Steele, Lea & Flood 2014). Not for
/// cryptography; for reproducible test data and workloads.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2^-32 for
    /// the sizes used here).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// `fp` with exactly `bits` distinct random bit positions flipped (`bits <= 64`).
    pub fn flip_bits(&mut self, fp: u64, bits: u32) -> u64 {
        let mut mask = 0u64;
        while mask.count_ones() < bits.min(64) {
            mask |= 1u64 << self.below(64);
        }
        fp ^ mask
    }
}

/// Size of the intersection of two strictly ascending slices (a linear merge). On slices that
/// are not strictly ascending the result is meaningless but the call does not panic.
pub fn sorted_intersection<T: Ord>(a: &[T], b: &[T]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

/// `n choose r` for the small numbers that table designs use (saturating).
pub fn binomial(n: u32, r: u32) -> u64 {
    if r > n {
        return 0;
    }
    let r = r.min(n - r) as u64;
    let mut acc: u64 = 1;
    for i in 0..r {
        acc = acc.saturating_mul(n as u64 - i) / (i + 1);
    }
    acc
}

/// Buckets below this size are sorted by comparison.
const SMALL: usize = 1 << 10;

/// Pieces of a bucket at most this long are sorted by comparison, not counted again.
const SHORT: usize = 64;

/// First step of a stable sort by `key` that never holds the sorted whole: where each
/// group of `src` by the top byte of `key` starts once grouped, with `src.len()` last (one
/// counting pass, in which `observe` sees every element). [`group_by_top_byte`] then
/// groups, and [`for_each_sorted_group`] finishes the sort.
///
/// Fingerprints spread evenly over the top bits, so a group of 10M holds about 40k and
/// the rest of its sort stays in cache.
pub(crate) fn top_byte_starts<S>(
    src: &[S],
    key: impl Fn(&S) -> u64,
    mut observe: impl FnMut(&S),
) -> [usize; 257] {
    group_starts(src, |x| {
        observe(x);
        (key(x) >> 56) as usize
    })
}

/// Second step of the sort [`top_byte_starts`] begins: `src` mapped into `out`, grouped
/// stably by the top byte of `key` (one scatter), given where the groups start. `map`
/// is chosen after the counting pass, so it may depend on what that pass observed.
pub(crate) fn group_by_top_byte<S, T: Copy>(
    src: &[S],
    key: impl Fn(&S) -> u64,
    starts: &[usize; 257],
    map: impl Fn(&S) -> T,
    out: &mut Vec<T>,
) {
    scatter_into(src, |x| (key(x) >> 56) as usize, starts, out, &map);
}

/// Last step of the sort [`top_byte_starts`] begins: sorts each group of `grouped`
/// stably by `key` (on the next byte with a counting pass through `scratch`, then on the
/// one after inside pieces still large, and by comparison below [`SMALL`]) and hands the
/// groups to `emit` sorted, in order. `grouped` is used as scratch.
pub(crate) fn for_each_sorted_group<T: Copy>(
    grouped: &mut [T],
    starts: &[usize; 257],
    key: impl Fn(&T) -> u64,
    scratch: &mut Vec<T>,
    mut emit: impl FnMut(&[T]),
) {
    let small = |piece: &mut [T]| piece.sort_by_key(&key);
    for b in 0..256 {
        let group = &mut grouped[starts[b]..starts[b + 1]];
        if group.len() <= SMALL {
            small(group);
            emit(group);
            continue;
        }
        let second = |x: &T| (key(x) >> 48) as u8 as usize;
        let sub = group_starts(group, second);
        scatter_into(group, second, &sub, scratch, &|x: &T| *x);
        for s in 0..256 {
            let r = sub[s]..sub[s + 1];
            finish_bucket(&mut scratch[r.clone()], &mut group[r], &key, &small);
        }
        emit(scratch);
    }
}

/// Sorts a bucket whose keys share their top 16 bits: with `small` when it is short, else
/// with a third counting pass (in cache by now, through `scratch`) on as many of the next
/// bits as leave about four elements a piece on even data (at most six), and `small` on
/// the pieces. Comparison sorts of ~150 elements were a fifth of building a 10M-document
/// run; a full byte for the third pass spent more on its 256 groups than on the elements.
fn finish_bucket<T: Copy>(
    v: &mut [T],
    scratch: &mut [T],
    key: &impl Fn(&T) -> u64,
    small: &impl Fn(&mut [T]),
) {
    const MOST: usize = 64;
    if v.len() <= SHORT {
        small(v);
        return;
    }
    let w = (v.len() / 4).ilog2().min(MOST.ilog2());
    let mask = (1u64 << w) - 1;
    let digit = |x: &T| ((key(x) >> (48 - w)) & mask) as usize;
    let mut starts = [0usize; MOST + 1];
    let starts = &mut starts[..=1 << w];
    count_starts(v, digit, starts);
    distribute::<_, _, MOST>(v, digit, starts, scratch, |slot, x| *slot = *x);
    for g in starts.windows(2) {
        small(&mut scratch[g[0]..g[1]]);
    }
    v.copy_from_slice(scratch);
}

/// Asks the CPU to start loading the cache line holding `items[at]` (a hint; an index out
/// of range is harmless).
#[inline(always)]
pub(crate) fn prefetch<T>(items: &[T], at: usize) {
    // No bounds check: the address is only computed (wrapping, so never undefined) and
    // handed to the hint, which reads nothing and never faults.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it does not access memory as far as the program is
    // concerned, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            items.as_ptr().wrapping_add(at) as *const i8,
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (items, at);
}

/// An empty vector with room for `capacity` elements, whose memory the kernel is asked to
/// back with huge pages (Linux transparent huge pages in `madvise` mode).
///
/// A query touches a few random places in each of several large tables; with 4 KiB pages
/// nearly every touch is also a TLB miss, and under virtualisation a page walk costs about
/// as much as the memory access itself. With 2 MiB pages, random reads over a 512 MiB
/// buffer measured twice as fast here. A hint only: elsewhere, or refused, nothing changes.
///
/// Only what queries read is asked for in huge pages. On a VM with free page reporting
/// (this one hands free memory back to the host in 8 MiB blocks), a huge page tends to come
/// from memory the host has taken back and must supply again, where plain pages come from
/// small, recently freed pieces first. Building 10M documents right after another process
/// had run spent 0.6-1.0 s in the kernel with the sorts' temporary arrays in plain pages,
/// against 1.0-1.5 s in huge pages.
pub(crate) fn huge_page_vec<T>(capacity: usize) -> Vec<T> {
    let v: Vec<T> = Vec::with_capacity(capacity);
    let bytes = capacity * std::mem::size_of::<T>();
    #[cfg(target_os = "linux")]
    if bytes >= 4 << 20 {
        let start = v.as_ptr() as usize;
        let first = (start + 4095) & !4095;
        let end = (start + bytes) & !4095;
        if end > first {
            // SAFETY: the range lies inside this vector's allocation; MADV_HUGEPAGE only
            // changes how the kernel backs it, never its contents or validity.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    v
}

/// `src` mapped through `map` into `out`, stably sorted on the top `bits` bits of the
/// mapped values only (`scratch` is for the sort to use as it likes).
///
/// A table's values are the sorted distinct fingerprints put through a permutation that
/// moves some bit blocks to the front and keeps the rest in order. Values that agree on
/// the moved blocks are then already in the table's order, so sorting on the prefix alone
/// sorts the table, with no pass over the low bits and no comparison sort at the end.
///
/// Most significant digit first: one counting pass and one scatter on the top byte (ten
/// bits past 16M values), then each group, about 40k values at 10M, sorted on the rest of
/// the prefix while it is in cache. The whole is moved through memory once, and needs no
/// second array of its size.
pub(crate) fn sort_on_top_bits<S: Values + ?Sized>(
    src: &S,
    map: impl Fn(u64) -> u64,
    bits: u32,
    out: &mut Vec<u64>,
    scratch: &mut Vec<u64>,
) {
    let bits = bits.min(64);
    let n = src.len();
    if bits == 0 {
        clear_with_room(out, n);
        src.for_each_chunk(|c| out.extend(c.iter().map(|&x| map(x))));
        return;
    }
    let top = bits.min(if n > 1 << 24 { 10 } else { 8 });
    let shift = 64 - top;
    let digit = |&x: &u64| (map(x) >> shift) as usize;
    let groups = 1 << top;
    let mut starts = vec![0usize; groups + 1];
    src.for_each_chunk(|c| count_into(c, digit, &mut starts[1..]));
    running_sum(&mut starts);
    assert_eq!(starts[groups], n, "the values' count changed");
    scatter_chunks_into(n, |each| src.for_each_chunk(each), digit, &starts, out, &|&x: &u64| {
        map(x)
    });
    for g in starts.windows(2) {
        sort_on_bits(&mut out[g[0]..g[1]], 64 - bits, bits - top, scratch);
    }
}

/// Sorted values given a chunk at a time, in order: an array, or a table decoded in pieces
/// so that a build needs no second copy of its values.
pub(crate) trait Values {
    /// How many values there are.
    fn len(&self) -> usize;
    /// Calls `f` with consecutive chunks that together hold every value, in order.
    fn for_each_chunk(&self, f: impl FnMut(&[u64]));
}

impl Values for [u64] {
    fn len(&self) -> usize {
        <[u64]>::len(self)
    }
    fn for_each_chunk(&self, mut f: impl FnMut(&[u64])) {
        f(self)
    }
}

/// Sorts `v` stably on bits `lo..lo + bits` of its values (`bits < 64`): by comparison
/// when short, else least significant digit first, at most 10 bits a pass, through
/// `scratch`.
fn sort_on_bits(v: &mut [u64], lo: u32, bits: u32, scratch: &mut Vec<u64>) {
    if bits == 0 || v.len() <= 1 {
        return;
    }
    if v.len() <= SHORT {
        let mask = (1u64 << bits) - 1;
        v.sort_by_key(|&y| (y >> lo) & mask);
        return;
    }
    if scratch.len() < v.len() {
        scratch.resize(v.len(), 0);
    }
    let s = &mut scratch[..v.len()];
    let passes = bits.div_ceil(10);
    let mut at = lo;
    for d in 0..passes {
        let w = (lo + bits - at).div_ceil(passes - d);
        let mask = (1u64 << w) - 1;
        let digit = |&y: &u64| ((y >> at) & mask) as usize;
        let (from, to): (&[u64], &mut [u64]) =
            if d % 2 == 0 { (&*v, &mut *s) } else { (&*s, &mut *v) };
        let starts = digit_starts(from, digit, 1 << w);
        distribute::<_, _, MAX_GROUPS>(from, digit, &starts, to, |slot, &y| *slot = y);
        at += w;
    }
    if passes % 2 == 1 {
        v.copy_from_slice(s);
    }
}

/// [`count_starts`] into a new array, for `groups` groups.
fn digit_starts<T>(src: &[T], digit: impl Fn(&T) -> usize, groups: usize) -> Vec<usize> {
    let mut starts = vec![0usize; groups + 1];
    count_starts(src, digit, &mut starts);
    starts
}

/// Empties `v` and makes room for `n` elements, in plain pages when it lacks it: the
/// buffers of a build's sorts are written and read once, in order, where huge pages buy
/// nothing, and they cost more to fault in than plain ones when memory comes back from the
/// host (see [`huge_page_vec`]).
pub(crate) fn clear_with_room<T>(v: &mut Vec<T>, n: usize) {
    v.clear();
    v.reserve_exact(n);
}

/// `src` mapped through `map` and written into `dst` grouped by `digit` (stably), given
/// where each group starts (`starts`, with `src.len()` last). Every slot of `dst` is
/// written once, so it is not cleared beforehand.
fn scatter_into<S, T>(
    src: &[S],
    digit: impl Fn(&S) -> usize,
    starts: &[usize],
    dst: &mut Vec<T>,
    map: &impl Fn(&S) -> T,
) {
    scatter_chunks_into(src.len(), |each| each(src), digit, starts, dst, map)
}

/// [`scatter_into`] for `n` elements that `chunks` gives, in order, a chunk at a time to
/// the function it is handed: the cursors carry over from one chunk to the next.
fn scatter_chunks_into<S, T>(
    n: usize,
    chunks: impl FnOnce(&mut dyn FnMut(&[S])),
    digit: impl Fn(&S) -> usize,
    starts: &[usize],
    dst: &mut Vec<T>,
    map: &impl Fn(&S) -> T,
) {
    clear_with_room(dst, n);
    let slots = &mut dst.spare_capacity_mut()[..n];
    let groups = starts.len() - 1;
    let mut next = [0usize; MAX_GROUPS];
    next[..groups].copy_from_slice(&starts[..groups]);
    chunks(&mut |c: &[S]| {
        next = distribute_from::<_, _, MAX_GROUPS>(c, &digit, next, slots, |slot, x| {
            slot.write(map(x));
        });
    });
    // Each group filled up to where the next starts: all `n` slots were written.
    assert!(next[..groups] == starts[1..], "digit counts changed");
    // SAFETY: the assertion above shows slots 0..n were all initialised.
    unsafe { dst.set_len(n) };
}

/// Where each of 256 groups by `digit` starts in `src` grouped (and `src.len()` last).
fn group_starts<T>(src: &[T], digit: impl FnMut(&T) -> usize) -> [usize; 257] {
    let mut starts = [0usize; 257];
    count_starts(src, digit, &mut starts);
    starts
}

/// Fills `starts` (zeroed, one more than a power-of-two number of groups) with where each
/// group by `digit` starts in `src` grouped, and `src.len()` last: one counting pass and
/// a running sum. Every pass of the build's radix sorts counts through here.
#[inline(always)]
fn count_starts<T>(src: &[T], digit: impl FnMut(&T) -> usize, starts: &mut [usize]) {
    count_into(src, digit, &mut starts[1..]);
    running_sum(starts);
}

/// Turns the counts in `starts[1..]` into where each group starts (`starts[0]` is 0).
#[inline(always)]
fn running_sum(starts: &mut [usize]) {
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
}

/// Adds the digits' counts of `src` to `counts` (a power of two of them).
#[inline(always)]
fn count_into<T>(src: &[T], mut digit: impl FnMut(&T) -> usize, counts: &mut [usize]) {
    let groups = counts.len();
    debug_assert!(groups.is_power_of_two());
    for x in src {
        // Masked so that indexing needs no check; digits are below `groups` anyway.
        counts[digit(x) & (groups - 1)] += 1;
    }
}

/// Most groups a scatter pass distributes into: digits have at most 10 bits.
const MAX_GROUPS: usize = 1 << 10;

/// The loop of both scatters: each element of `src` goes to `put(&mut dst[next[d]])` for
/// its digit `d` (below `G`, a power of two at most [`MAX_GROUPS`]), which then advances;
/// the cursors start at `starts` (one per group, and the end last). Returns the cursors
/// where they stopped.
#[inline(always)]
fn distribute<S, D, const G: usize>(
    src: &[S],
    digit: impl Fn(&S) -> usize,
    starts: &[usize],
    dst: &mut [D],
    put: impl Fn(&mut D, &S),
) -> [usize; G] {
    let mut next = [0usize; G];
    let groups = starts.len() - 1;
    next[..groups].copy_from_slice(&starts[..groups]);
    distribute_from(src, digit, next, dst, put)
}

/// [`distribute`] with the cursors given, as one chunk of a longer source leaves them.
#[inline(always)]
fn distribute_from<S, D, const G: usize>(
    src: &[S],
    digit: impl Fn(&S) -> usize,
    mut next: [usize; G],
    dst: &mut [D],
    put: impl Fn(&mut D, &S),
) -> [usize; G] {
    let ahead = (128 / std::mem::size_of::<D>().max(1)).max(1);
    for x in src {
        // Masked so that indexing `next` needs no check; digits are below it anyway.
        let d = digit(x) & (G - 1);
        let at = next[d];
        put(&mut dst[at], x);
        next[d] = at + 1;
        // Stores that miss the cache wait in line for their line one at a time; asking
        // for each group's line two ahead lets those loads overlap (three times faster
        // here on 10M values in 256 groups).
        prefetch(dst, at + ahead);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An array given `.1` values at a time.
    struct InChunks<'a>(&'a [u64], usize);

    impl Values for InChunks<'_> {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn for_each_chunk(&self, mut f: impl FnMut(&[u64])) {
            self.0.chunks(self.1).for_each(&mut f);
        }
    }

    #[test]
    fn binomials() {
        assert_eq!(binomial(6, 3), 20);
        assert_eq!(binomial(5, 2), 10);
        assert_eq!(binomial(4, 1), 4);
        assert_eq!(binomial(3, 4), 0);
        assert_eq!(binomial(64, 0), 1);
    }

    #[test]
    fn flips_exact_count() {
        let mut r = SplitMix64::new(7);
        for bits in 0..=64 {
            let x = r.next_u64();
            assert_eq!(hamming(x, r.flip_bits(x, bits)), bits);
        }
    }

    #[test]
    fn below_in_range() {
        let mut r = SplitMix64::new(1);
        for n in 1..200u64 {
            assert!(r.below(n) < n);
        }
    }

    #[test]
    fn sorting_on_top_bits_sorts_order_keeping_images() {
        let mut r = SplitMix64::new(9);
        let (mut out, mut tmp) = (Vec::new(), Vec::new());
        for n in [0usize, 1, 7, 5_000, 40_000] {
            let mut src: Vec<u64> = (0..n).map(|_| r.next_u64()).collect();
            // Crowded: a quarter share their top 20 bits.
            for x in src.iter_mut().step_by(4) {
                *x = 0xF0F0_F000_0000_0000 | (*x >> 20);
            }
            src.sort_unstable();
            src.dedup();
            for bits in [0u32, 5, 8, 16, 21, 26, 33, 64] {
                // The low `bits` bits rotated to the front: the rest keep their order.
                let map = |x: u64| x.rotate_right(bits);
                sort_on_top_bits(src.as_slice(), map, bits, &mut out, &mut tmp);
                let mut want: Vec<u64> = src.iter().map(|&x| map(x)).collect();
                want.sort_unstable();
                assert_eq!(out, want, "n {n} bits {bits}");
                // The same values given in chunks: the scatter's cursors carry over.
                for chunk in [1, 7, 4096] {
                    sort_on_top_bits(&InChunks(&src, chunk), map, bits, &mut out, &mut tmp);
                    assert_eq!(out, want, "n {n} bits {bits} in chunks of {chunk}");
                }
            }
        }
        // Stable on the prefix alone: equal prefixes keep the input order.
        let src: Vec<u64> = (0..3000u64).map(|i| ((i % 7) << 60) | i).collect();
        sort_on_top_bits(src.as_slice(), |x| x, 4, &mut out, &mut tmp);
        let mut want = src.clone();
        want.sort_by_key(|x| x >> 60);
        assert_eq!(out, want);
    }

    /// `v` sorted stably by `key` through [`top_byte_starts`], [`group_by_top_byte`] and
    /// [`for_each_sorted_group`].
    fn grouped_sort<T: Copy>(v: &[T], key: impl Fn(&T) -> u64 + Copy) -> Vec<T> {
        let (mut grouped, mut scratch, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let mut seen = 0;
        let starts = top_byte_starts(v, key, |_| seen += 1);
        group_by_top_byte(v, key, &starts, |x| *x, &mut grouped);
        assert_eq!(seen, v.len(), "every element observed once");
        for_each_sorted_group(&mut grouped, &starts, key, &mut scratch, |g| {
            out.extend_from_slice(g)
        });
        out
    }

    #[test]
    fn radix_sort_sorts_like_sort_unstable() {
        let mut r = SplitMix64::new(5);
        // Uniform; one crowded top byte; crowded 16-bit prefix; small; two kinds of ties. The
        // crowded shapes and the ties take every pass, down to the third.
        let shapes: Vec<Vec<u64>> = vec![
            (0..50_000).map(|_| r.next_u64()).collect(),
            (0..50_000)
                .map(|i| if i % 2 == 0 { r.next_u64() >> 8 } else { r.next_u64() })
                .collect(),
            (0..50_000).map(|_| 0xABCD_0000_0000_0000 | (r.next_u64() >> 16)).collect(),
            (0..100).map(|_| r.next_u64()).collect(),
            (0..20_000).map(|_| r.below(300) << 50).collect(),
            // Many ties that differ below the radix digits, in random order.
            (0..20_000).map(|_| (r.below(3) << 62) | r.below(50)).collect(),
        ];
        for v in shapes {
            let mut want = v.clone();
            want.sort_unstable();
            assert_eq!(grouped_sort(&v, |&x| x), want);
            // Pairs keep ties in their second field's order.
            let pairs: Vec<(u64, u32)> =
                v.iter().enumerate().map(|(i, &x)| (x, i as u32)).collect();
            let mut want: Vec<(u64, u32)> = pairs.clone();
            want.sort_unstable();
            assert_eq!(grouped_sort(&pairs, |p| p.0), want);
            // The stable sort keeps ties in input order, which here is not the order of
            // the second field.
            let recs: Vec<(u64, u32)> = v
                .iter()
                .enumerate()
                .map(|(i, &x)| (x, (i as u32).wrapping_mul(2_654_435_761)))
                .collect();
            let mut want = recs.clone();
            want.sort_by_key(|p| p.0);
            assert_eq!(grouped_sort(&recs, |p| p.0), want);
        }
    }
}

//! Slices alias their parent, know it, and keep its memory alive.

use super::expect::{contents, context0, device_bytes, pattern};
use crate::{CaseResult, Fixture};

/// Writing through a slice is visible in the parent, at the slice's offset.
pub(crate) fn slice_aliases_parent(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(1000, 1);
    let buf = device_bytes(&ctx, &before);
    let part = buf.slice(200, 100).expect("slice");
    assert_eq!(part.size(), 100);
    assert_eq!(part.address(), buf.address() + 200);
    assert_eq!(contents(&part), &before[200..300]);
    part.copy_from_host(b"through the slice", 10, None)
        .expect("copy_from_host");
    let mut expected = before;
    expected[210..227].copy_from_slice(b"through the slice");
    assert_eq!(contents(&buf), expected);
    Ok(())
}

/// Writing through the parent is visible in its slices.
pub(crate) fn parent_writes_show_in_slice(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(1000, 2));
    let part = buf.slice(500, 20).expect("slice");
    buf.copy_from_host(b"0123456789", 505, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&part)[5..15], b"0123456789");
    let src = device_bytes(&ctx, b"ABCDE");
    buf.copy_from_device(&src, 515, None)
        .expect("copy_from_device");
    assert_eq!(&contents(&part)[15..], b"ABCDE");
    Ok(())
}

/// A slice of a slice is at the sum of the offsets of the root, and aliases it both
/// ways.
pub(crate) fn slice_of_slice_aliases_root(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let before = pattern(1000, 3);
    let root = device_bytes(&ctx, &before);
    let mid = root.slice(100, 500).expect("slice");
    let inner = mid.slice(50, 10).expect("slice of slice");
    assert_eq!(inner.address(), root.address() + 150);
    assert_eq!(contents(&inner), &before[150..160]);
    inner
        .copy_from_host(b"inner", 0, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&root)[150..155], b"inner");
    assert_eq!(&contents(&mid)[50..55], b"inner");
    root.copy_from_host(b"root", 156, None)
        .expect("copy_from_host");
    assert_eq!(&contents(&inner)[6..], b"root");
    let tail = mid.slice_from(495).expect("slice_from");
    assert_eq!(tail.address(), root.address() + 595);
    assert_eq!(contents(&tail), &before[595..600]);
    Ok(())
}

/// `parent()` of a slice is the whole buffer it was sliced from; a whole buffer has none.
/// A slice of a slice holds the root, not the chain (fixed pyarrow quirk): its parent is
/// the original buffer.
pub(crate) fn slice_parent_returns_the_parent(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let root = device_bytes(&ctx, &pattern(100, 4));
    assert!(root.parent().is_none(), "a whole buffer has no parent");
    let mid = root.slice(10, 80).expect("slice");
    let inner = mid.slice(5, 5).expect("slice of slice");
    let p = mid.parent().expect("a slice has a parent");
    assert_eq!((p.address(), p.size()), (root.address(), root.size()));
    let p = inner.parent().expect("a slice of a slice has a parent");
    assert_eq!(
        (p.address(), p.size()),
        (root.address(), root.size()),
        "the parent of a slice of a slice is the whole buffer"
    );
    assert!(p.parent().is_none(), "a parent is never itself a slice");
    Ok(())
}

/// A cursor-style loop of slices (`rest = rest.slice(1, rest.size() - 1)`) keeps one
/// root per slice, never the chain of intermediate slices: after
/// 100,000 steps the slice's parent is still the whole buffer, and the bytes are right.
pub(crate) fn slice_chain_holds_the_root_not_the_chain(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let data = pattern(100_001, 9);
    let root = device_bytes(&ctx, &data);
    let mut rest = root.slice_from(0).expect("slice_from(0)");
    for _ in 0..100_000 {
        rest = rest.slice(1, rest.size() - 1).expect("cursor slice");
    }
    assert_eq!(rest.size(), 1);
    assert_eq!(rest.address(), root.address() + 100_000);
    let parent = rest.parent().expect("a slice has a parent");
    assert_eq!(
        (parent.address(), parent.size()),
        (root.address(), root.size())
    );
    assert!(parent.parent().is_none(), "depth 1, not 100,000");
    drop(root);
    assert_eq!(contents(&rest), &data[100_000..]);
    Ok(())
}

/// A slice keeps the memory alive after its parent is dropped: its bytes stay readable
/// and writable, and `bytes_allocated` counts the allocation until the slice drops too.
pub(crate) fn slice_keeps_memory_alive_after_parent_drop(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let start = ctx.bytes_allocated();
    let data = pattern(1000, 5);
    let buf = device_bytes(&ctx, &data);
    assert_eq!(ctx.bytes_allocated(), start + 1000);
    let part = buf.slice(900, 100).expect("slice");
    let inner = part.slice(50, 50).expect("slice of slice");
    drop(buf);
    assert_eq!(
        ctx.bytes_allocated(),
        start + 1000,
        "the slice keeps the allocation"
    );
    assert_eq!(contents(&part), &data[900..]);
    drop(part);
    assert_eq!(
        ctx.bytes_allocated(),
        start + 1000,
        "the inner slice keeps the allocation"
    );
    inner
        .copy_from_host(b"alive", 0, None)
        .expect("copy_from_host into the last slice");
    assert_eq!(&contents(&inner)[..5], b"alive");
    drop(inner);
    assert_eq!(ctx.bytes_allocated(), start, "freed with the last slice");
    Ok(())
}

/// Zero-length slices are allowed anywhere up to and including `size`.
pub(crate) fn zero_length_slices_are_allowed_up_to_size(f: &Fixture) -> CaseResult {
    let (_b, ctx) = context0(f);
    let buf = device_bytes(&ctx, &pattern(10, 6));
    for offset in [0, 5, 10] {
        let s = buf.slice(offset, 0).expect("zero-length slice");
        assert!(s.is_empty());
        assert_eq!(s.to_vec().expect("to_vec"), Vec::<u8>::new());
    }
    let s = buf.slice_from(10).expect("slice_from(size)");
    assert_eq!(s.size(), 0);
    let whole = buf.slice(0, 10).expect("slice of everything");
    assert_eq!(whole.address(), buf.address());
    assert_eq!(contents(&whole), contents(&buf));
    let empty = ctx.new_buffer(0).expect("new_buffer(0)");
    assert_eq!(empty.slice(0, 0).expect("slice of empty").size(), 0);
    Ok(())
}

//! The buffer property: live [`DeviceBuffer`] handles against `(allocation, offset, len)`
//! views of model allocations.

use cudabuf_core::{Context, DeviceBuffer, ErrorKind, IpcMemHandle};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

use super::{amount, max_ops, pattern, run_property, Amount, Trace};
use crate::harness::{CaseResult, Fixture, Skip};

/// One generated operation; buffers and exports are picked by [`Index`] among those live
/// when it runs (an operation on nothing is skipped), so shrinking never invalidates it.
#[derive(Clone, Debug)]
enum Op {
    New {
        device: Index,
        size: usize,
    },
    FromHost {
        device: Index,
        size: usize,
        seed: u64,
    },
    FromDevice {
        device: Index,
        src: Index,
    },
    Clone {
        buf: Index,
    },
    CopyFromHost {
        dst: Index,
        position: Amount,
        len: Amount,
        nbytes: Option<Amount>,
        seed: u64,
    },
    CopyToHost {
        src: Index,
        position: Amount,
        nbytes: Option<Amount>,
    },
    CopyToHostInto {
        src: Index,
        position: Amount,
        dst_len: Amount,
        nbytes: Option<Amount>,
    },
    Slice {
        buf: Index,
        offset: Amount,
        length: Amount,
    },
    SliceFrom {
        buf: Index,
        offset: Amount,
    },
    CopyFromDevice {
        dst: Index,
        src: Index,
        position: Amount,
        nbytes: Option<Amount>,
    },
    Export {
        buf: Index,
    },
    Open {
        export: Index,
        device: Index,
    },
    Drop {
        buf: Index,
    },
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => Just(0usize),
        4 => 1usize..=64,
        3 => 1usize..=4096,
        1 => Just(4096usize),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let i = any::<Index>;
    prop_oneof![
        3 => (i(), size()).prop_map(|(device, size)| Op::New { device, size }),
        3 => (i(), size(), any::<u64>())
            .prop_map(|(device, size, seed)| Op::FromHost { device, size, seed }),
        1 => (i(), i()).prop_map(|(device, src)| Op::FromDevice { device, src }),
        2 => i().prop_map(|buf| Op::Clone { buf }),
        6 => (i(), amount(), amount(), proptest::option::of(amount()), any::<u64>()).prop_map(
            |(dst, position, len, nbytes, seed)| Op::CopyFromHost { dst, position, len, nbytes, seed }
        ),
        3 => (i(), amount(), proptest::option::of(amount()))
            .prop_map(|(src, position, nbytes)| Op::CopyToHost { src, position, nbytes }),
        2 => (i(), amount(), amount(), proptest::option::of(amount())).prop_map(
            |(src, position, dst_len, nbytes)| Op::CopyToHostInto { src, position, dst_len, nbytes }
        ),
        5 => (i(), amount(), amount())
            .prop_map(|(buf, offset, length)| Op::Slice { buf, offset, length }),
        1 => (i(), amount()).prop_map(|(buf, offset)| Op::SliceFrom { buf, offset }),
        6 => (i(), i(), amount(), proptest::option::of(amount())).prop_map(
            |(dst, src, position, nbytes)| Op::CopyFromDevice { dst, src, position, nbytes }
        ),
        2 => i().prop_map(|buf| Op::Export { buf }),
        3 => (i(), i()).prop_map(|(export, device)| Op::Open { export, device }),
        5 => i().prop_map(|buf| Op::Drop { buf }),
    ]
}

/// Run the property (see the module docs of [`super`]).
pub(super) fn run(f: &Fixture) -> CaseResult {
    let devices = f.backend().num_devices().expect("num_devices");
    if devices == 0 {
        return Err(Skip("the backend reports no device".into()));
    }
    let devices = devices.min(2);
    let ops = proptest::collection::vec(op(), 1..=max_ops());
    run_property("buffer_semantics_match_vec_model", ops, |ops| {
        let backend = f.backend();
        let trace = Trace::default();
        let mut ctxs = Vec::new();
        for d in 0..devices {
            match backend.context(d) {
                Ok(ctx) => ctxs.push(ctx),
                Err(e) => return Err(trace.fail(format!("context({d}): {e}"))),
            }
        }
        let mut state = State {
            ctxs,
            allocs: Vec::new(),
            live: Vec::new(),
            exports: Vec::new(),
            next_name: 0,
            trace,
        };
        for (step, op) in ops.iter().enumerate() {
            state.apply(step as u64, op)?;
            state.check_all()?;
        }
        let lines = state.trace.lines.clone();
        let r = state.finish();
        if std::env::var("XDEBUG").is_ok() {
            eprintln!("----\n{}", lines.join("\n"));
        }
        r
    });
    Ok(())
}

/// One model allocation: what a device allocation (or an empty buffer) holds.
struct Alloc {
    device: usize,
    bytes: Vec<u8>,
    /// Counted in `bytes_allocated` while alive.
    owning: bool,
}

/// A live buffer handle and what it views in the model.
struct Handle {
    name: usize,
    alloc: usize,
    offset: usize,
    len: usize,
    buf: DeviceBuffer,
}

/// An exported IPC handle and what it names in the model.
struct Export {
    handle: IpcMemHandle,
    exporter: usize,
    alloc: usize,
    offset: usize,
    len: usize,
    address: u64,
}

struct State {
    ctxs: Vec<Context>,
    allocs: Vec<Alloc>,
    live: Vec<Handle>,
    exports: Vec<Export>,
    next_name: usize,
    trace: Trace,
}

impl State {
    fn view(&self, h: &Handle) -> &[u8] {
        &self.allocs[h.alloc].bytes[h.offset..h.offset + h.len]
    }

    fn pick(&self, i: &Index) -> Option<usize> {
        (!self.live.is_empty()).then(|| i.index(self.live.len()))
    }

    fn name(&mut self) -> usize {
        self.next_name += 1;
        self.next_name - 1
    }

    /// A new model allocation with its first handle.
    fn push_alloc(&mut self, name: usize, device: usize, bytes: Vec<u8>, buf: DeviceBuffer) {
        let len = bytes.len();
        self.allocs.push(Alloc {
            device,
            owning: len > 0,
            bytes,
        });
        self.live.push(Handle {
            name,
            alloc: self.allocs.len() - 1,
            offset: 0,
            len,
            buf,
        });
    }

    fn alive(&self) -> Vec<bool> {
        let mut alive = vec![false; self.allocs.len()];
        for h in &self.live {
            alive[h.alloc] = true;
        }
        alive
    }

    fn apply(&mut self, step: u64, op: &Op) -> Result<(), TestCaseError> {
        let devices = self.ctxs.len();
        match op {
            Op::New { device, size } => {
                let d = device.index(devices);
                let name = self.name();
                self.trace
                    .step(format!("b{name} = ctx{d}.new_buffer({size})"));
                let r = self.ctxs[d].new_buffer(*size);
                self.trace.outcome(&r, &Ok::<(), _>(()))?;
                let buf = r.expect("checked");
                ensure!(self.trace, buf.size() == *size, "size() is {}", buf.size());
                if *size == 0 {
                    ensure!(
                        self.trace,
                        buf.address() == 0,
                        "a zero-size buffer has address {:#x}",
                        buf.address()
                    );
                }
                // The contents of a new buffer are unspecified: the model adopts them.
                let bytes = match buf.to_vec() {
                    Ok(b) if b.len() == *size => b,
                    other => {
                        return Err(self
                            .trace
                            .fail(format!("reading the new buffer: {other:?}")))
                    }
                };
                self.push_alloc(name, d, bytes, buf);
            }
            Op::FromHost { device, size, seed } => {
                let d = device.index(devices);
                let data = pattern(seed ^ (step << 48), *size);
                let name = self.name();
                self.trace.step(format!(
                    "b{name} = ctx{d}.buffer_from_data(&[{size} host bytes])"
                ));
                let r = self.ctxs[d].buffer_from_data(&data);
                self.trace.outcome(&r, &Ok::<(), _>(()))?;
                self.push_alloc(name, d, data, r.expect("checked"));
            }
            Op::FromDevice { device, src } => {
                let Some(s) = self.pick(src) else {
                    return Ok(());
                };
                let d = device.index(devices);
                let name = self.name();
                let src = &self.live[s];
                self.trace.step(format!(
                    "b{name} = ctx{d}.buffer_from_data(&b{}) [{} bytes]",
                    src.name, src.len
                ));
                let r = self.ctxs[d].buffer_from_data(&src.buf);
                self.trace.outcome(&r, &Ok::<(), _>(()))?;
                let bytes = self.view(&self.live[s]).to_vec();
                self.push_alloc(name, d, bytes, r.expect("checked"));
            }
            Op::Clone { buf } => {
                let Some(b) = self.pick(buf) else {
                    return Ok(());
                };
                let name = self.name();
                let h = &self.live[b];
                self.trace.step(format!("b{name} = b{}.clone()", h.name));
                let h = Handle {
                    name,
                    alloc: h.alloc,
                    offset: h.offset,
                    len: h.len,
                    buf: h.buf.clone(),
                };
                self.live.push(h);
            }
            Op::CopyFromHost {
                dst,
                position,
                len,
                nbytes,
                seed,
            } => {
                let Some(b) = self.pick(dst) else {
                    return Ok(());
                };
                let h = &self.live[b];
                let size = h.len;
                let position = position.of(size);
                let data = pattern(
                    seed ^ (step << 48),
                    len.host_len(size.saturating_sub(position)),
                );
                let nbytes = nbytes.as_ref().map(|a| a.of(data.len()));
                let n = nbytes.unwrap_or(data.len());
                let expected = if n > data.len() {
                    Err(ErrorKind::SourceTooShort)
                } else if position.checked_add(n).is_none_or(|end| end > size) {
                    Err(ErrorKind::OutOfRange)
                } else {
                    Ok(n)
                };
                self.trace.step(format!(
                    "b{}[{size} bytes].copy_from_host(&[{} host bytes], {position}, {nbytes:?})",
                    h.name,
                    data.len()
                ));
                let r = h.buf.copy_from_host(&data, position, nbytes);
                self.trace.outcome(&r, &expected)?;
                if let (Ok(got), Ok(n)) = (&r, expected) {
                    ensure!(self.trace, *got == n, "returned {got}, expected {n}");
                    let (alloc, start) = (h.alloc, h.offset + position);
                    self.allocs[alloc].bytes[start..start + n].copy_from_slice(&data[..n]);
                }
            }
            Op::CopyToHost {
                src,
                position,
                nbytes,
            } => {
                let Some(b) = self.pick(src) else {
                    return Ok(());
                };
                let h = &self.live[b];
                let size = h.len;
                let position = position.of(size);
                let nbytes = nbytes.as_ref().map(|a| a.of(size.saturating_sub(position)));
                let expected = if position > size {
                    Err(ErrorKind::OutOfRange)
                } else {
                    let n = nbytes.unwrap_or(size - position);
                    match position.checked_add(n) {
                        Some(end) if end <= size => Ok(self.view(h)[position..end].to_vec()),
                        _ => Err(ErrorKind::OutOfRange),
                    }
                };
                self.trace.step(format!(
                    "b{}[{size} bytes].copy_to_host({position}, {nbytes:?})",
                    h.name
                ));
                let r = h.buf.copy_to_host(position, nbytes);
                self.trace.outcome(&r, &expected)?;
                if let (Ok(got), Ok(want)) = (&r, &expected) {
                    ensure!(
                        self.trace,
                        got == want,
                        "read {got:?}, the model holds {want:?}"
                    );
                }
            }
            Op::CopyToHostInto {
                src,
                position,
                dst_len,
                nbytes,
            } => {
                let Some(b) = self.pick(src) else {
                    return Ok(());
                };
                let h = &self.live[b];
                let size = h.len;
                let position = position.of(size);
                let dst_len = dst_len.host_len(size.saturating_sub(position));
                let nbytes = nbytes.as_ref().map(|a| a.of(dst_len));
                let expected = if position > size {
                    Err(ErrorKind::OutOfRange)
                } else {
                    let avail = size - position;
                    match nbytes {
                        None => Ok(avail.min(dst_len)),
                        Some(n) if n > dst_len || n > avail => Err(ErrorKind::OutOfRange),
                        Some(n) => Ok(n),
                    }
                };
                let before = pattern(step ^ 0xd57, dst_len);
                let mut dst = before.clone();
                self.trace.step(format!(
                    "b{}[{size} bytes].copy_to_host_into({position}, &mut [{dst_len} bytes], {nbytes:?})",
                    h.name
                ));
                let r = h.buf.copy_to_host_into(position, &mut dst, nbytes);
                self.trace.outcome(&r, &expected)?;
                match (&r, expected) {
                    (Ok(got), Ok(n)) => {
                        ensure!(self.trace, *got == n, "returned {got}, expected {n}");
                        ensure!(
                            self.trace,
                            dst[..n] == self.view(h)[position..position + n],
                            "read {:?}, the model holds {:?}",
                            &dst[..n],
                            &self.view(h)[position..position + n]
                        );
                        ensure!(
                            self.trace,
                            dst[n..] == before[n..],
                            "bytes past the {n} copied were written"
                        );
                    }
                    _ => ensure!(
                        self.trace,
                        dst == before,
                        "a refused copy wrote into the destination"
                    ),
                }
            }
            Op::Slice {
                buf,
                offset,
                length,
            } => {
                let Some(b) = self.pick(buf) else {
                    return Ok(());
                };
                let offset = offset.of(self.live[b].len);
                let length = length.of(self.live[b].len.saturating_sub(offset));
                self.slice(b, offset, Some(length))?;
            }
            Op::SliceFrom { buf, offset } => {
                let Some(b) = self.pick(buf) else {
                    return Ok(());
                };
                let offset = offset.of(self.live[b].len);
                self.slice(b, offset, None)?;
            }
            Op::CopyFromDevice {
                dst,
                src,
                position,
                nbytes,
            } => {
                let (Some(d), Some(s)) = (self.pick(dst), self.pick(src)) else {
                    return Ok(());
                };
                let (dh, sh) = (&self.live[d], &self.live[s]);
                let position = position.of(dh.len);
                let fits = sh.len.min(dh.len.saturating_sub(position));
                let nbytes = nbytes.as_ref().map(|a| match a {
                    Amount::All => sh.len,
                    Amount::Within(i) => i.index(fits + 1),
                    other => other.of(sh.len),
                });
                let n = nbytes.unwrap_or(sh.len);
                let expected = if n > sh.len {
                    Err(ErrorKind::SourceTooShort)
                } else if position.checked_add(n).is_none_or(|end| end > dh.len) {
                    Err(ErrorKind::OutOfRange)
                } else {
                    Ok(n)
                };
                let same = if dh.alloc == sh.alloc {
                    ", same allocation"
                } else {
                    ""
                };
                self.trace.step(format!(
                    "b{}[{} bytes, dev {}].copy_from_device(&b{}[{} bytes, dev {}{same}], {position}, {nbytes:?})",
                    dh.name,
                    dh.len,
                    self.allocs[dh.alloc].device,
                    sh.name,
                    sh.len,
                    self.allocs[sh.alloc].device,
                ));
                let r = dh.buf.copy_from_device(&sh.buf, position, nbytes);
                self.trace.outcome(&r, &expected)?;
                if let (Ok(got), Ok(n)) = (&r, expected) {
                    ensure!(self.trace, *got == n, "returned {got}, expected {n}");
                    // As if through a temporary, also for overlapping ranges of one allocation.
                    let tmp = self.view(sh)[..n].to_vec();
                    let (alloc, start) = (dh.alloc, dh.offset + position);
                    self.allocs[alloc].bytes[start..start + n].copy_from_slice(&tmp);
                }
            }
            Op::Export { buf } => {
                let Some(b) = self.pick(buf) else {
                    return Ok(());
                };
                let h = &self.live[b];
                self.trace.step(format!(
                    "h{} = b{}[{} bytes at offset {} of its allocation].export_for_ipc()",
                    self.exports.len(),
                    h.name,
                    h.len,
                    h.offset
                ));
                let r = h.buf.export_for_ipc();
                self.trace.outcome(&r, &Ok::<(), _>(()))?;
                let handle = r.expect("checked");
                ensure!(
                    self.trace,
                    handle.size() == h.len,
                    "the handle's size is {}",
                    handle.size()
                );
                if h.len > 0 {
                    // The offset is into the backend allocation holding the buffer: its own
                    // allocation, or with the caching allocator on a segment shared with
                    // other buffers (where the model's allocation starts further in).
                    let segment = h.buf.context().raw().address_range(h.buf.address());
                    let in_segment = segment.map(|(base, _)| h.buf.address() - base);
                    ensure!(
                        self.trace,
                        in_segment.as_ref().ok() == Some(&(handle.offset() as u64))
                            && handle.offset() >= h.offset,
                        "the handle's offset is {}, the buffer is at {in_segment:?} of its \
                         backend allocation and at {} of its buffer",
                        handle.offset(),
                        h.offset
                    );
                }
                let bytes = handle.to_bytes();
                match IpcMemHandle::from_bytes(&bytes) {
                    Ok(back) => ensure!(
                        self.trace,
                        back == handle,
                        "the handle's bytes do not round trip: {back:?}"
                    ),
                    Err(e) => {
                        return Err(self
                            .trace
                            .fail(format!("the handle's own bytes are refused: {e}")))
                    }
                }
                self.exports.push(Export {
                    handle,
                    exporter: h.name,
                    alloc: h.alloc,
                    offset: h.offset,
                    len: h.len,
                    address: h.buf.address(),
                });
            }
            Op::Open { export, device } => {
                if self.exports.is_empty() {
                    return Ok(());
                }
                let x = export.index(self.exports.len());
                let d = device.index(devices);
                let name = self.name();
                let e = &self.exports[x];
                let alive = self.alive()[e.alloc];
                let on = self.allocs[e.alloc].device;
                self.trace.step(format!(
                    "b{name} = ctx{d}.open_ipc_buffer(h{x}) [{} bytes exported by b{} on device {on}; allocation {}]",
                    e.len,
                    e.exporter,
                    if alive { "alive" } else { "gone" }
                ));
                // In the exporting process a handle opens as a view of the exporter's
                // memory, through a context of the exporter's device only.
                let expected = if e.len == 0 || (alive && d == on) {
                    Ok(())
                } else {
                    Err(ErrorKind::InvalidIpcHandle)
                };
                let r = self.ctxs[d].open_ipc_buffer(&e.handle);
                self.trace.outcome(&r, &expected)?;
                let Ok(buf) = r else { return Ok(()) };
                ensure!(
                    self.trace,
                    buf.size() == e.len,
                    "the opened buffer has {} bytes",
                    buf.size()
                );
                if e.len == 0 {
                    self.push_alloc(name, d, Vec::new(), buf);
                } else {
                    ensure!(
                        self.trace,
                        buf.address() == e.address,
                        "opened at {:#x}, not a view of the exporter's memory at {:#x}",
                        buf.address(),
                        e.address
                    );
                    let (alloc, offset, len) = (e.alloc, e.offset, e.len);
                    self.live.push(Handle {
                        name,
                        alloc,
                        offset,
                        len,
                        buf,
                    });
                }
            }
            Op::Drop { buf } => {
                let Some(b) = self.pick(buf) else {
                    return Ok(());
                };
                let h = self.live.remove(b);
                self.trace.step(format!("drop(b{})", h.name));
                drop(h);
            }
        }
        Ok(())
    }

    /// `slice(offset, length)`, or `slice_from(offset)` when `length` is `None`.
    fn slice(
        &mut self,
        b: usize,
        offset: usize,
        length: Option<usize>,
    ) -> Result<(), TestCaseError> {
        let name = self.name();
        let h = &self.live[b];
        let size = h.len;
        let expected = match length {
            Some(length) if offset.checked_add(length).is_some_and(|end| end <= size) => Ok(length),
            None if offset <= size => Ok(size - offset),
            _ => Err(ErrorKind::OutOfRange),
        };
        let r = match length {
            Some(length) => {
                self.trace.step(format!(
                    "b{name} = b{}[{size} bytes].slice({offset}, {length})",
                    h.name
                ));
                h.buf.slice(offset, length)
            }
            None => {
                self.trace.step(format!(
                    "b{name} = b{}[{size} bytes].slice_from({offset})",
                    h.name
                ));
                h.buf.slice_from(offset)
            }
        };
        self.trace.outcome(&r, &expected)?;
        let (Ok(slice), Ok(len)) = (r, expected) else {
            return Ok(());
        };
        ensure!(
            self.trace,
            slice.size() == len,
            "the slice has {} bytes",
            slice.size()
        );
        let want = h.buf.address() + offset as u64;
        ensure!(
            self.trace,
            slice.address() == want,
            "the slice is at {:#x}, not {want:#x}",
            slice.address()
        );
        ensure!(
            self.trace,
            {
                // The parent is the whole buffer at the root of the handle's slices.
                let root = h.buf.parent().unwrap_or(&h.buf);
                slice
                    .parent()
                    .is_some_and(|p| p.address() == root.address() && p.size() == root.size())
            },
            "the slice's parent is {:?}",
            slice.parent()
        );
        let (alloc, offset) = (h.alloc, h.offset + offset);
        self.live.push(Handle {
            name,
            alloc,
            offset,
            len,
            buf: slice,
        });
        Ok(())
    }

    /// Every live buffer reads back as the model says, and `bytes_allocated` matches.
    fn check_all(&self) -> Result<(), TestCaseError> {
        for h in &self.live {
            ensure!(
                self.trace,
                h.buf.size() == h.len,
                "b{} has {} bytes, the model {}",
                h.name,
                h.buf.size(),
                h.len
            );
            match h.buf.to_vec() {
                Ok(bytes) => {
                    let want = self.view(h);
                    if let Some(i) = (0..h.len).find(|&i| bytes.get(i) != want.get(i)) {
                        return Err(self.trace.fail(format!(
                            "b{} differs from the model at byte {i} of {}: reads {:?}.., the model holds {:?}..",
                            h.name,
                            h.len,
                            &bytes[i..bytes.len().min(i + 8)],
                            &want[i..h.len.min(i + 8)]
                        )));
                    }
                }
                Err(e) => return Err(self.trace.fail(format!("reading b{} back: {e}", h.name))),
            }
        }
        let alive = self.alive();
        for (d, ctx) in self.ctxs.iter().enumerate() {
            let want: usize = self
                .allocs
                .iter()
                .zip(&alive)
                .filter(|(a, alive)| **alive && a.owning && a.device == d)
                .map(|(a, _)| a.bytes.len())
                .sum();
            let got = ctx.bytes_allocated();
            ensure!(
                self.trace,
                got == want,
                "ctx{d}.bytes_allocated() is {got}, the live owning allocations hold {want}"
            );
        }
        Ok(())
    }

    /// Drop every handle (checking after each), then: nothing allocated, and the exported
    /// handles of nonzero size no longer open.
    fn finish(mut self) -> Result<(), TestCaseError> {
        while let Some(h) = self.live.pop() {
            self.trace.step(format!("drop(b{}) [end]", h.name));
            drop(h);
            self.check_all()?;
        }
        for (d, ctx) in self.ctxs.iter().enumerate() {
            ensure!(
                self.trace,
                ctx.bytes_allocated() == 0,
                "ctx{d}.bytes_allocated() is {} with every buffer dropped",
                ctx.bytes_allocated()
            );
        }
        for x in 0..self.exports.len() {
            let e = &self.exports[x];
            self.trace.step(format!(
                "ctx0.open_ipc_buffer(h{x}) [{} bytes; everything dropped]",
                e.len
            ));
            let r = self.ctxs[0].open_ipc_buffer(&e.handle);
            let expected = if e.len == 0 {
                Ok(())
            } else {
                Err(ErrorKind::InvalidIpcHandle)
            };
            self.trace.outcome(&r, &expected)?;
        }
        Ok(())
    }
}

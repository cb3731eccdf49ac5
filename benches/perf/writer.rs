//! `writer`: `BufferWriter`, buffered and unbuffered, in 256 B, 4 KiB and 64 KiB writes.

use std::time::Duration;

use cudabuf::{Backend, BufferWriter, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::{human, progress, Records};
use crate::timing::{gbps, median, pattern, time_calls};
use crate::{AnyResult, KIB, MIB};

pub(crate) fn writer(
    _bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let total = if opts.quick { 16 * MIB } else { 128 * MIB };
    let dev = ctx.new_buffer(total)?;
    let source = pattern(total);
    // (name, staging size (0: unbuffered), whether chunks stream from a large host buffer)
    let modes = [
        ("buffered", MIB, false),
        ("buffered", 4 * MIB, false),
        ("buffered_stream", 4 * MIB, true),
        ("unbuffered", 0, false),
    ];
    for chunk in [256usize, 4 * KIB, 64 * KIB] {
        for (mode, staging, stream) in modes {
            // Unbuffered small writes are one driver copy each: cap their count.
            let bytes = if staging == 0 {
                total.min(chunk * 16384)
            } else {
                total
            };
            progress(format!(
                "writer {mode} (staging {}) {} chunks, {}",
                human(staging),
                human(chunk),
                human(bytes)
            ));
            let hot = pattern(chunk);
            let mut s = time_calls(1, 3, 9, Duration::from_millis(500), || {
                let mut w = BufferWriter::new(dev.clone());
                w.set_buffer_size(staging)?;
                let mut at = 0;
                while at < bytes {
                    let data = if stream {
                        &source[at..at + chunk]
                    } else {
                        &hot[..]
                    };
                    w.write_bytes(data)?;
                    at += chunk;
                }
                w.close()?;
                Ok(())
            })?;
            let n = s.len();
            let (op, note) = if staging == 0 {
                (
                    format!("{mode}_{}", human(chunk).replace(' ', "")),
                    format!("{} writes", bytes / chunk),
                )
            } else {
                (
                    format!(
                        "{mode}_{}_staging{}",
                        human(chunk).replace(' ', ""),
                        human(staging).replace(' ', "")
                    ),
                    if stream {
                        format!("chunks of a {} host buffer", human(total))
                    } else {
                        "the same hot chunk each write".to_owned()
                    },
                )
            };
            let v = gbps(bytes, median(&mut s));
            rec.push("writer", op, Some(bytes), v, "GB/s", n, note);
        }
    }
    let staging = 4 * MIB;
    // Check the streamed bytes landed.
    let mut w = BufferWriter::new(dev.clone());
    w.set_buffer_size(staging)?;
    for part in source.chunks(4 * KIB) {
        w.write_bytes(part)?;
    }
    w.close()?;
    if dev.to_vec()? != source {
        return Err("writer: the bytes on the device are wrong".into());
    }
    Ok(())
}

//! A file straight into device memory and back: write a file, read it into a device
//! buffer (pipelined through pinned staging, several threads), read a range of it, write
//! the device bytes to a second file, and check both against the first with a checksum
//! of what comes back from the device.
//!
//! ```text
//! cargo run --example file_to_device                   # on the simulator, 64 MiB
//! cargo run --example file_to_device -- 256 /scratch   # 256 MiB, the file under /scratch
//! CUDABUF_BACKEND=cuda cargo run --release --features cuda --example file_to_device -- 1024
//! ```

use std::fs::File;
use std::process::ExitCode;
use std::time::Instant;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("file_to_device failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// FNV-1a over the bytes: enough to tell two byte strings apart here.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn run() -> AnyResult<()> {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(64);
    let dir = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    println!(
        "backend: {}; device 0: {}",
        backend.kind(),
        backend.device(0)?.name()?
    );

    // 1. A file of `mib` MiB of varied bytes.
    let path = dir.join(format!("cudabuf-file-to-device-{}.bin", std::process::id()));
    let bytes: Vec<u8> = (0..mib << 20)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7])
        .collect();
    std::fs::write(&path, &bytes)?;
    let want = checksum(&bytes);
    println!(
        "wrote {} ({} MiB, checksum {want:016x})",
        path.display(),
        mib
    );

    // 2. The whole file into a new device buffer.
    let options = ctx.file_options();
    let started = Instant::now();
    let buf = ctx.read_file(&path)?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "read_file: {} bytes in {:.1} ms ({:.2} GB/s; chunks of {} KiB, up to {} threads)",
        buf.size(),
        secs * 1e3,
        buf.size() as f64 / secs / 1e9,
        options.chunk_size() >> 10,
        options.threads()
    );
    let got = checksum(&buf.to_vec()?);
    println!("checksum of the device bytes: {got:016x}");
    if got != want {
        return Err("the device holds other bytes than the file".into());
    }

    // 3. A range at an unaligned offset, into a buffer the caller made.
    let (offset, len) = (12_345usize, bytes.len() / 3);
    let part = ctx.new_buffer(len)?;
    part.read_file_at(&File::open(&path)?, offset as u64)?;
    if checksum(&part.to_vec()?) != checksum(&bytes[offset..offset + len]) {
        return Err("the range read differs from the file".into());
    }
    println!("read_file_at: {len} bytes from byte {offset} match");

    // 4. The device bytes out to a second file.
    let copy = dir.join(format!(
        "cudabuf-file-to-device-{}.copy",
        std::process::id()
    ));
    let started = Instant::now();
    buf.write_file_at(&File::create(&copy)?, 0)?;
    let secs = started.elapsed().as_secs_f64();
    let written = std::fs::read(&copy)?;
    println!(
        "write_file_at: {} bytes in {:.1} ms ({:.2} GB/s), checksum {:016x}",
        written.len(),
        secs * 1e3,
        written.len() as f64 / secs / 1e9,
        checksum(&written)
    );
    if written != bytes {
        return Err("the written file differs from the first".into());
    }
    std::fs::remove_file(&path)?;
    std::fs::remove_file(&copy)?;
    println!("ok");
    Ok(())
}

//! cudabuf's quickstart: a context, device buffers, copies, a pinned host buffer, an IPC
//! hand-off to a child process, and a reader/writer, printing what it does.
//!
//! ```text
//! cargo run --example quickstart                                  # on the simulator
//! CUDABUF_BACKEND=cuda cargo run --features cuda --example quickstart   # on a GPU
//! ```

use std::io::{Read, Seek, SeekFrom, Write};
use std::process::{Command, ExitCode};

use cudabuf::{BufferReader, BufferWriter, IpcMemHandle};

/// Set in the re-executed child: the IPC handle to open, as hex.
const CHILD_VAR: &str = "CUDABUF_QUICKSTART_HANDLE";

fn main() -> ExitCode {
    let result = match std::env::var(CHILD_VAR) {
        Ok(hex) => child(&hex),
        Err(_) => parent(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart failed: {e}");
            ExitCode::FAILURE
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn parent() -> AnyResult<()> {
    // 1. A backend and a context: the simulator unless CUDABUF_BACKEND=cuda.
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    let device = backend.device(0)?;
    println!(
        "backend: {} ({} device(s)); using device 0: {} with {} MiB",
        backend.kind(),
        backend.num_devices()?,
        device.name()?,
        device.total_memory()? >> 20
    );

    // 2. Device buffers and copies.
    let buf = ctx.new_buffer(64)?;
    buf.copy_from_host(b"cudabuf moves bytes to the device", 0, None)?;
    let back = buf.copy_to_host(0, Some(33))?;
    println!(
        "copied 33 bytes to {:#x} and back: {:?}",
        buf.address(),
        String::from_utf8_lossy(&back)
    );
    let words = buf.slice(8, 5)?; // zero-copy: "moves"
    println!(
        "slice(8, 5) aliases its parent: {:?}",
        String::from_utf8_lossy(&words.to_vec()?)
    );
    let copy = ctx.buffer_from_data(&words)?; // device-to-device copy
    println!(
        "buffer_from_data copied it; bytes_allocated = {}",
        ctx.bytes_allocated()
    );

    // 3. Pinned host memory: fast copies, and a device address of its own.
    let mut pinned = backend.new_host_buffer(16, 0)?;
    copy.copy_to_host_into(0, &mut pinned, None)?;
    println!(
        "pinned host buffer holds {:?}; its device address is {:#x}",
        String::from_utf8_lossy(&pinned[..5]),
        ctx.get_device_address(pinned.as_ptr() as u64)?
    );

    // 4. Writer and reader: std::io over device memory, staged through pinned memory.
    let table = ctx.new_buffer(32)?;
    let mut writer = BufferWriter::new(table.clone());
    writer.set_buffer_size(4096)?;
    for row in 0u32..8 {
        writer.write_all(&(row * row).to_le_bytes())?;
    }
    writer.close()?;
    let mut reader = BufferReader::new(table.clone());
    reader.seek(SeekFrom::Start(12))?;
    let mut square = [0u8; 4];
    reader.read_exact(&mut square)?;
    println!(
        "wrote 8 squares through a buffered writer; the reader finds row 3 = {}",
        u32::from_le_bytes(square)
    );

    // 5. IPC: export a slice, let a child process open it and write into it.
    let shared = buf.slice(32, 16)?;
    shared.copy_from_host(b"parent says hi  ", 0, None)?;
    let handle = shared.export_for_ipc()?;
    let hex = hex::encode(handle.to_bytes());
    println!(
        "exported a 16-byte slice at offset 32 ({} handle bytes); starting a child process",
        handle.to_bytes().len()
    );
    let status = Command::new(std::env::current_exe()?)
        .env(CHILD_VAR, hex)
        .status()?;
    if !status.success() {
        return Err(format!("the child process failed: {status}").into());
    }
    let reply = shared.to_vec()?;
    println!(
        "the parent now reads {:?} from its slice",
        String::from_utf8_lossy(&reply)
    );
    if reply != b"child replies ok" {
        return Err("the child's reply did not arrive".into());
    }

    drop((buf, words, copy, table, shared, reader, writer));
    println!(
        "all buffers dropped: bytes_allocated = {}",
        ctx.bytes_allocated()
    );
    Ok(())
}

fn child(hex: &str) -> AnyResult<()> {
    let bytes = hex::decode(hex)?;
    let handle = IpcMemHandle::from_bytes(&bytes)?;
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    let buf = ctx.open_ipc_buffer(&handle)?;
    println!(
        "  child {}: opened {} bytes: {:?}",
        std::process::id(),
        buf.size(),
        String::from_utf8_lossy(&buf.to_vec()?)
    );
    buf.copy_from_host(b"child replies ok", 0, None)?;
    ctx.synchronize()?;
    Ok(())
}

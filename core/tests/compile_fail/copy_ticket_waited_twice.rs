// Item 3: a ticket is waited for exactly once: it is neither `Copy` nor `Clone`, so a
// second wait is a use after move (E0382), even in `unsafe` code.
use cudabuf_core::Context;

fn wait_twice(ctx: &Context, dst: u64, src: &[u8]) -> cudabuf_core::Result<()> {
    unsafe {
        let ticket = ctx.raw().copy_host_to_device_async(dst, src)?;
        ctx.raw().wait_copy(ticket)?;
        ctx.raw().wait_copy(ticket)
    }
}

fn main() {
    let _ = wait_twice;
}

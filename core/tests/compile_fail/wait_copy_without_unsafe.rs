// Item 3: `wait_copy` trusts its ticket (a `CUevent` on CUDA), so calling it through the
// public `Context::raw()` needs `unsafe` (E0133).
use cudabuf_core::backend::CopyTicket;
use cudabuf_core::Context;

fn wait(ctx: &Context) {
    let _ = ctx.raw().wait_copy(CopyTicket::completed());
}

fn main() {
    let _ = wait;
}

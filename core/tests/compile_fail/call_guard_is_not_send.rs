// A `CallGuard` restores the current call of the thread that entered it: moved to another
// thread (a future held across an `.await` on a multi-threaded runtime) it would restore
// that thread's instead. It is not `Send` (E0277).
use cudabuf_core::backend::{enter_public, ApiCall};

fn needs_send<T: Send>(_: T) {}

fn main() {
    let guard = enter_public(ApiCall::at("Stream::copy_device", std::panic::Location::caller()));
    needs_send(guard);
}

// Item 3: nor through a struct literal of the private field (E0451).
use cudabuf_core::backend::CopyTicket;

fn main() {
    let _forged = CopyTicket { 0: 5 };
}

// Item 3: the backends' way to make a ticket from their value is `unsafe` (E0133).
use cudabuf_core::backend::CopyTicket;

fn main() {
    let _forged = CopyTicket::from_raw(5);
}

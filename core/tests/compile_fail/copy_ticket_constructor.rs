// Item 3: safe code cannot turn an integer into a ticket: the tuple field is private, so
// the constructor is not visible (E0423).
use cudabuf_core::backend::CopyTicket;

fn main() {
    let _forged = CopyTicket(5);
}

//! The HTTP stack every request goes through: one hyper client per connection pool with a
//! deadline on every request, HTTP/2 streams spread over connections, and kcp's `/clusters/<name>`
//! routing on top of one client.

pub mod client;
pub mod deadline;
pub mod route;
pub mod spread;

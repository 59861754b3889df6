//! Discovery benchmark (filled in below).
fn main() {}

mod pin;
fn main() {}

fn main() {
    println!("{}", health_agent::object::HEALTH_EBPF.len());
}

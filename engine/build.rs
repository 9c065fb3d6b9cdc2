//! Compiles `proto/htc.proto` with protox, a protobuf compiler written in Rust, so building needs
//! no `protoc` on the machine.
fn main() {
    println!("cargo:rerun-if-changed=proto/htc.proto");
    let fds = match protox::compile(["proto/htc.proto"], ["proto/"]) {
        Ok(fds) => fds,
        Err(e) => panic!("proto/htc.proto: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(fds) {
        panic!("generating Rust from proto/htc.proto: {e}");
    }
}

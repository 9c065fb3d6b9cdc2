fn main() {
    println!("cargo:rerun-if-changed=proto/htc.proto");
    prost_build::Config::new()
        .compile_protos(&["proto/htc.proto"], &["proto/"])
        .expect("compiling proto/htc.proto (is protoc installed? apt-get install protobuf-compiler)");
}

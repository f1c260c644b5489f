//! Compiles the .proto files with protox (pure Rust; no system `protoc`).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/quorumq/v1/raft.proto",
        "proto/quorumq/v1/cluster.proto",
        "proto/quorumq/v1/admin.proto",
    ];
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .bytes(".")
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}

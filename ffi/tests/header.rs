//! The committed `include/braid.h` is what cbindgen makes of the crate today.
use std::path::Path;

#[test]
fn the_committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut fresh);
    let path = dir.join("include/braid.h");
    if std::env::var_os("BRAID_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write include/braid.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    if committed != fresh {
        let (old, new) = (
            String::from_utf8_lossy(&committed),
            String::from_utf8_lossy(&fresh),
        );
        let first = old
            .lines()
            .zip(new.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(old.lines().count().min(new.lines().count()));
        panic!(
            "ffi/include/braid.h is stale (first difference at line {}: committed {:?}, \
             generated {:?}); regenerate it with BRAID_BLESS=1 cargo test -p braid-ffi --test header",
            first + 1,
            old.lines().nth(first).unwrap_or("<end>"),
            new.lines().nth(first).unwrap_or("<end>"),
        );
    }
    // cbindgen followed every module: a function from each is declared.
    let header = String::from_utf8_lossy(&fresh);
    for f in [
        "braid_last_error",
        "braid_device_open",
        "braid_mr_register",
        "braid_cq_fd",
        "braid_post_send",
    ] {
        assert!(
            header.contains(&format!("{f}(")),
            "{f} missing from the header"
        );
    }
}

//! Rewrites `packaging/generated/` (man pages and shell completions) from the clap definitions:
//! `cargo run --release --example generate_docs`. `tests/it/package.rs` fails until the
//! committed copy matches what the command line says.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/generated");
    // Generated files only: whatever is there was written by this program, and a page of a
    // command that no longer exists must not survive.
    if out.exists() {
        std::fs::remove_dir_all(&out)?;
    }
    for (path, contents) in claimgate::cli::docs() {
        let path = out.join(path);
        std::fs::create_dir_all(path.parent().expect("files live in a folder"))?;
        std::fs::write(&path, contents)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

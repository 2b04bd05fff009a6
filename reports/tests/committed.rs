//! The committed results folder's figures (`reports/results/`), read as files.

use std::path::{Path, PathBuf};

/// The `.svg` files under `dir`, recursively.
fn figures(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            figures(&p, out);
        } else if p.extension().is_some_and(|x| x == "svg") {
            out.push(p);
        }
    }
}

/// Every committed figure is compact SVG, as `rlany report` writes it now
/// (`rlany_reports::svg::compact`). The figures of reports made before it — the suites whose
/// runs are not in the repository among them — were converted by this test once:
/// `RLANY_BLESS=1 cargo test -p rlany-reports --test committed`.
#[test]
fn committed_figures_are_compact() {
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    let mut all = Vec::new();
    figures(&results, &mut all);
    assert!(all.len() > 100, "only {} figures found", all.len());
    let bless = std::env::var_os("RLANY_BLESS").is_some();
    let mut loose = Vec::new();
    for p in &all {
        let text = std::fs::read_to_string(p).expect("a readable figure");
        let compact =
            rlany_reports::svg::compact(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if compact != text {
            if bless {
                std::fs::write(p, &compact).expect("rewrite the figure");
            } else {
                loose.push(p.display().to_string());
            }
        }
    }
    assert!(
        loose.is_empty(),
        "figures not compact (`RLANY_BLESS=1 cargo test -p rlany-reports --test committed` \
         rewrites them):\n  {}",
        loose.join("\n  ")
    );
}

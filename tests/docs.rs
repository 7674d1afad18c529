//! The documents hold together: every relative link in README.md and docs/*.md names a file that
//! exists and, with `#anchor`, a heading in it (anchors made the way GitHub makes them); the
//! README links every document; and the README stays a front door. No root needed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The README and every document under docs/.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir("docs")
        .expect("docs/ exists")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    docs.insert(0, PathBuf::from("README.md"));
    docs
}

/// Lines outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: lower case, punctuation other than `-` and `_` gone,
/// spaces to dashes; a repeated heading gets `-1`, `-2`, ...
fn anchors(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let slug: String = line[hashes..]
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while out.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        out.insert(candidate);
    }
    out
}

/// The targets of `[text](target)` links in a line, outside inline code.
fn links(line: &str) -> Vec<String> {
    let mut code = false;
    let plain: String = line
        .chars()
        .filter(|&c| {
            if c == '`' {
                code = !code;
                return false;
            }
            !code
        })
        .collect();
    let mut out = Vec::new();
    let mut rest = plain.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].trim();
        if !target.is_empty() && !target.contains(' ') {
            out.push(target.to_string());
        }
        rest = &rest[end..];
    }
    out
}

/// Every broken relative link in `doc`, as `file:line: target: why`.
fn broken_links(doc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(doc).expect("readable document");
    let mut bad = Vec::new();
    for (no, line) in prose(&text) {
        for target in links(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() { doc.to_path_buf() } else { doc.parent().unwrap_or(Path::new("")).join(path) };
            if !dest.exists() {
                bad.push(format!("{}:{no}: {target}: no such file", doc.display()));
                continue;
            }
            if !anchor.is_empty() {
                let dest_text = std::fs::read_to_string(&dest).unwrap_or_default();
                if !anchors(&dest_text).contains(anchor) {
                    bad.push(format!("{}:{no}: {target}: no heading #{anchor} in {}", doc.display(), dest.display()));
                }
            }
        }
    }
    bad
}

#[test]
fn every_link_in_the_docs_resolves() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        checked += 1;
        bad.extend(broken_links(&doc));
    }
    assert!(checked > 5, "README.md and docs/*.md were read");
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn the_checker_finds_a_broken_file_and_a_broken_anchor() {
    let dir = std::env::temp_dir().join(format!("lb-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let doc = dir.join("a.md");
    std::fs::write(
        &doc,
        "# Title\n## Hot reload\n[ok](#hot-reload) [ok](a.md#title) [gone](b.md) [bad](#cold-reload)\n`[code](c.md)`\n```\n[fenced](d.md)\n```\n",
    )
    .expect("write");
    let bad = broken_links(&doc);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].ends_with("b.md: no such file"), "{bad:?}");
    assert!(bad[1].contains("no heading #cold-reload"), "{bad:?}");
}

#[test]
fn the_readme_links_every_document_and_stays_short() {
    let readme = std::fs::read_to_string("README.md").expect("README.md");
    for doc in documents().into_iter().skip(1) {
        let name = doc.display().to_string();
        assert!(readme.contains(&format!("]({name}")), "README.md does not link {name}");
    }
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines: depth belongs in docs/, the README is the front door");
}

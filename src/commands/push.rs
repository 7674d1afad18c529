//! `lb push FILE --to etcd://.../KEY`: a fleet's change in one command. The file is validated
//! with `lb check`'s rules, compared with the pool the store holds (what `lb diff` would
//! move), then written with the pool it replaces in one transaction that holds only if the
//! stored pool is still the one compared against: two pushes from the same revision cannot
//! both land.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use lb::config;
use lb::fleet::StoreUrl;

use lb::{diff, report};

use crate::store::{Client, Pushed, TlsArgs, CALL_TIMEOUT};

#[derive(clap::Args)]
pub struct Args {
    /// The pool YAML file to push (no `previous:` line: the store keeps the pool it replaces).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Where: etcd://HOST:PORT[,HOST:PORT...]/KEY, the URL the nodes' --config names.
    #[arg(long, value_name = "URL")]
    to: String,
    /// Validate and show what would move, and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Push only if the stored pool is still the one written at revision REV (what a review
    /// looked at, `lb push --dry-run` or `lb fleet` printed it); 0: only if there is none yet.
    #[arg(long, value_name = "REV")]
    expect_revision: Option<u64>,
    /// Print JSON: the revision compared against, the diff, and the revision written.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    tls: TlsArgs,
}

/// The fleet's previous pool once FILE is pushed, with the revision that wrote it: the stored
/// pool, which the nodes serve. A stored pool that does not validate (written by hand) is
/// served by no node: the pool before it, from the store's history, if that one validates. None
/// when there is nothing the nodes would accept (no pool yet, a history compacted away).
fn previous_for(client: &Client, to: &StoreUrl, current: Option<&crate::store::client::Kv>, old: Option<&Option<lb::config::Pool>>) -> Option<(u64, Vec<u8>)> {
    let kv = current?;
    if matches!(old, Some(Some(_))) {
        return Some((kv.mod_revision, kv.value.clone()));
    }
    let before = client.range_at(&to.key, &format!("{}\0", to.key), kv.mod_revision.checked_sub(1)?).ok()?;
    let kv = before.get(&to.key)?;
    lb::fleet::parse_pool(to, kv.mod_revision, &kv.value, None).ok()?;
    Some((kv.mod_revision, kv.value.clone()))
}

/// `--to`'s and `lb fleet`'s URL, read here rather than by clap, whose error would echo a
/// password given in it.
pub(crate) fn store_url(s: &str) -> Result<StoreUrl> {
    StoreUrl::parse(s).map_err(|e| anyhow::anyhow!("{e}"))
}

pub fn run(args: Args) -> Result<ExitCode> {
    let to = store_url(&args.to)?;
    let (pool, bytes) = config::load_bytes(&args.file).map_err(anyhow::Error::new)?;
    if pool.previous_file.is_some() {
        // Positioned as a validation error is.
        let text = String::from_utf8_lossy(&bytes);
        return Err(anyhow::Error::new(config::field_error(
            &args.file,
            &text,
            "previous",
            "the store keeps the pool this one replaces (lb push writes both): remove this line",
        )));
    }
    let client = Client::new(&to, &args.tls, CALL_TIMEOUT)?;
    let stored = client.range(&to.key, &to.range_end()).context("reading the pool in the store")?;
    let current = stored.get(&to.key);
    let base = current.map_or(0, |kv| kv.mod_revision);
    if let Some(expected) = args.expect_revision.filter(|&r| r != base) {
        if args.json {
            // `conflict: true`, as a conflict found by the transaction says it.
            let v = serde_json::json!({"to": to.to_string(), "base_revision": base, "dry_run": args.dry_run, "unchanged": false, "conflict": true, "revision": null});
            super::to_stdout(|out| {
                serde_json::to_writer(&mut *out, &v)?;
                writeln!(out)?;
                Ok(())
            })?;
        }
        bail!(
            "{}: conflict: the stored pool is at revision {base}, not {expected} as --expect-revision says; nothing was written (look at it with lb fleet, then push again)",
            to
        );
    }
    let old = current.map(|kv| lb::fleet::parse_pool(&to, kv.mod_revision, &kv.value, None).ok());
    let replaced = previous_for(&client, &to, current, old.as_ref());
    let new = lb::load::at_full_capacity(&pool);
    let diffs = diff::diff(&old.clone().flatten().map_or_else(Default::default, |p| lb::load::at_full_capacity(&p)), &new);
    let same = current.is_some_and(|kv| kv.value == bytes);
    let outcome = if args.dry_run || same {
        None
    } else {
        Some(client.push(&to, &bytes, base, replaced.as_ref().map(|(_, b)| b.as_slice()))?)
    };
    super::to_stdout(|out| {
        if args.json {
            let written = match &outcome {
                Some(Pushed::Written(r)) => serde_json::json!(r),
                _ => serde_json::Value::Null,
            };
            let v = serde_json::json!({
                "to": to.to_string(),
                "base_revision": base,
                "dry_run": args.dry_run,
                "unchanged": same,
                "conflict": outcome == Some(Pushed::Conflict),
                "revision": written,
                "previous_revision": replaced.as_ref().map(|(r, _)| *r),
                "diff": report::diff_json(&diffs),
            });
            serde_json::to_writer(&mut *out, &v).context("writing JSON")?;
            writeln!(out)?;
        } else {
            match (&old, base) {
                (None, _) => writeln!(out, "{}: no pool yet; this is the first", to)?,
                (Some(None), r) => writeln!(out, "{}: the stored pool (revision {r}) is not valid (no node serves it): it is replaced", to)?,
                (Some(Some(_)), r) => writeln!(out, "{}: against revision {r}:", to)?,
            }
            write!(out, "{}", report::diff_text(&diffs))?;
            match &outcome {
                _ if same => writeln!(out, "unchanged: the store holds this pool already (revision {base}); nothing written")?,
                None => writeln!(out, "dry run: nothing written")?,
                Some(Pushed::Written(r)) => match &replaced {
                    Some((at, _)) => writeln!(out, "pushed: revision {r}; the previous pool is the one written at revision {at}")?,
                    None => writeln!(out, "pushed: revision {r}, with no previous pool (second chance lists no previous owners for this change)")?,
                },
                Some(Pushed::Conflict) => {}
            }
        }
        Ok(())
    })?;
    if outcome == Some(Pushed::Conflict) {
        bail!(
            "{}: conflict: the pool changed after revision {base}, which this push was compared against; nothing was written (look at it with lb fleet, then push again)",
            to
        );
    }
    Ok(ExitCode::SUCCESS)
}

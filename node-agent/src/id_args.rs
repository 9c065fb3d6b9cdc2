//! Task ids as commands take them: words of ids and ranges (`5 17-20`, `3,7-9`).

/// Every id `ids` names, in the order named.
pub fn id_list(ids: &[String]) -> anyhow::Result<Vec<u64>> {
    let mut v = Vec::new();
    for s in ids {
        for r in htc_core::idset::parse(s).map_err(|e| anyhow::anyhow!("{s}: {e}"))? {
            v.extend(r);
        }
    }
    Ok(v)
}

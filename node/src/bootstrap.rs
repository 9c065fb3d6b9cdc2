//! How an agent finds its parent in the tree. Each agent with children publishes its listening
//! address in a key-value space, all agents meet at a fence, and each reads its parent's address.
//! Under Slurm the space is the srun step's PMI2 KVS (no controller RPC, findings §6); locally it
//! is a directory of small files in the run directory.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use htc_core::tree::Tree;

use crate::pmi::Pmi;

pub enum Kvs {
    Pmi(Pmi),
    /// One file per key in this directory; `get` waits for the file to appear.
    Files(PathBuf),
}

impl Kvs {
    fn put(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        match self {
            Kvs::Pmi(p) => p.put(key, value).context("PMI2 put")?,
            Kvs::Files(dir) => {
                std::fs::create_dir_all(&*dir)?;
                let tmp = dir.join(format!(".{key}.tmp"));
                std::fs::write(&tmp, value)?;
                std::fs::rename(&tmp, dir.join(key))?;
            }
        }
        Ok(())
    }

    fn fence(&mut self) -> anyhow::Result<()> {
        if let Kvs::Pmi(p) = self {
            p.fence().context("PMI2 fence")?;
        }
        Ok(())
    }

    fn get(&mut self, key: &str) -> anyhow::Result<String> {
        match self {
            Kvs::Pmi(p) => p.get(key).context("PMI2 get")?.with_context(|| format!("PMI2: no value for {key}")),
            Kvs::Files(dir) => {
                let end = Instant::now() + Duration::from_secs(60);
                loop {
                    if let Ok(v) = std::fs::read_to_string(dir.join(key)) {
                        return Ok(v);
                    }
                    if Instant::now() > end {
                        bail!("no address for {key} in {} after 60 s", dir.display());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

/// Where this agent connects, and the listener for its children if it has any.
pub struct Place {
    pub parent: SocketAddr,
    pub relay: Option<TcpListener>,
}

/// Agents whose parent is the leader connect to it; the others to their parent agent.
pub fn place(kvs: &mut Kvs, agent: u32, tree: &Tree, leader: SocketAddr, ip: IpAddr) -> anyhow::Result<Place> {
    let relay = if tree.children(Some(agent)).next().is_some() {
        let l = crate::slurm::listen(SocketAddr::new(ip, 0)).context("listening for child agents")?;
        let addr = SocketAddr::new(ip, l.local_addr()?.port());
        kvs.put(&format!("htc-addr-{agent}"), &addr.to_string())?;
        Some(l)
    } else {
        None
    };
    kvs.fence()?;
    let parent = match tree.parent(agent) {
        None => leader,
        Some(up) => {
            let key = format!("htc-addr-{up}");
            let v = kvs.get(&key)?;
            v.trim().parse().with_context(|| format!("bad address '{v}' for {key}"))?
        }
    };
    Ok(Place { parent, relay })
}

//! The clients of an open run (`htc task add`, `htc task cancel`, `htc close`): requests over one
//! authenticated connection, each answered in order. Task lines are parsed here, off the core's
//! thread, so a flood of adds never delays dispatch; what they add is the core's to decide, and
//! its answer (the ids) comes only once they are committed.

use std::sync::mpsc;

use tokio::net::TcpStream;

use super::core::{Input, NewTask};
use super::driver::Event;
use crate::frame::{self, read_frame, FrameError};
use htc_core::taskfile::Parser;
use htc_engine::wire::proto::{self, frame::Body, request::What};
use htc_engine::wire::PROTOCOL_VERSION;

/// Serves one client until it closes its side.
pub async fn serve(mut s: TcpStream, hello: proto::ClientHello, core: mpsc::Sender<Event>) -> Result<(), String> {
    if hello.protocol != PROTOCOL_VERSION {
        let error = format!("protocol {} not supported (the run speaks {PROTOCOL_VERSION})", hello.protocol);
        let _ =
            frame::write_frame(&mut s, Body::Reply(proto::Reply { error: error.clone(), ..Default::default() })).await;
        return Err(error);
    }
    let mut buf = Vec::new();
    loop {
        let request = match read_frame(&mut s, &mut buf).await {
            Ok(Body::Request(r)) => r,
            Ok(_) => return Err("unexpected frame from a client".into()),
            Err(FrameError::Closed) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        let seq = request.seq;
        let reply = match answer(request.what, &core).await {
            Ok(reply) => proto::Reply { seq, ..reply },
            Err(error) => proto::Reply { seq, error, ..Default::default() },
        };
        frame::write_frame(&mut s, Body::Reply(reply)).await.map_err(|e| e.to_string())?;
    }
}

async fn answer(what: Option<What>, core: &mpsc::Sender<Event>) -> Result<proto::Reply, String> {
    let gone = |_| "the run is ending".to_string();
    let ids = |ids| proto::Reply { ids, ..Default::default() };
    match what {
        Some(What::Status(q)) => {
            let states = states(core, (!q.all).then_some(q.ids)).await?;
            Ok(proto::Reply { states, ..Default::default() })
        }
        Some(What::Add(a)) => {
            let tasks = parse(&a)?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            core.send(Event::Add(tasks, tx)).map_err(gone)?;
            let answer = rx.await.map_err(|_| "the run ended before its tasks were committed".to_string())?;
            // A refusal of the core's names a line of what the client sent.
            answer.map(ids).map_err(|why| {
                if why.starts_with(|c: char| c.is_ascii_digit()) {
                    format!("{}:{why}", a.source)
                } else {
                    why
                }
            })
        }
        Some(What::Cancel(c)) => {
            // How they stood before: the client tells which it cancelled, which had ended and
            // which the run does not have.
            let states = states(core, Some(c.ids.clone())).await?;
            core.send(Event::Core(Input::Cancel { ids: c.ids.clone() })).map_err(gone)?;
            Ok(proto::Reply { ids: c.ids, states, ..Default::default() })
        }
        Some(What::Explain(q)) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            core.send(Event::Explain(q.ids, tx)).map_err(gone)?;
            let whys = rx.await.map_err(|_| "the run is ending".to_string())??;
            Ok(proto::Reply { whys, ..Default::default() })
        }
        Some(What::Close(c)) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            core.send(Event::Close(c.cancel, tx)).map_err(gone)?;
            rx.await.map_err(|_| "the run is ending".to_string())??;
            Ok(proto::Reply::default())
        }
        None => Err("an empty request".into()),
    }
}

/// How these tasks stand (all: `None`), as the core answers once its writes are committed.
async fn states(core: &mpsc::Sender<Event>, ids: Option<Vec<u64>>) -> Result<Vec<proto::TaskState>, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    core.send(Event::Status(ids, tx)).map_err(|_| "the run is ending".to_string())?;
    let states = rx.await.map_err(|_| "the run is ending".to_string())?;
    Ok(states
        .into_iter()
        .map(|t| proto::TaskState {
            id: t.id,
            state: t.state.into(),
            exit: t.exit,
            reason: t.reason,
            name: t.name.unwrap_or_default(),
        })
        .collect())
}

/// The longest name a task may be given.
const MAX_NAME: usize = 255;

/// A request's task lines as tasks to add; a bad line refuses the whole request, named as
/// `source:line:column` counted from its `first_line`.
pub fn parse(a: &proto::AddTasks) -> Result<Vec<NewTask>, String> {
    // An empty request (`htc task add --file -` of an empty stream) adds nothing and is no
    // error: a client that says it is there (an open run's idle time counts from its last add).
    if a.lines.is_empty() {
        return Ok(Vec::new());
    }
    let first = a.first_line.max(1);
    let mut p = Parser::new(&a.lines[..], a.source.clone()).adding();
    let mut tasks = Vec::new();
    loop {
        match p.next_task() {
            Ok(Some(t)) => {
                let line = t.line + first - 1;
                let (needs, rules) = (t.after.clone(), t.rules.clone());
                tasks.push(NewTask {
                    line,
                    command: t.command.to_vec(),
                    shell: t.shell,
                    shape: t.options,
                    needs,
                    rules,
                    key: None,
                    name: None,
                    class: None,
                });
            }
            Ok(None) => break,
            Err(mut e) => {
                e.line += first - 1;
                return Err(e.to_string());
            }
        }
    }
    // A class goes by its name: `shape.class` is the parser's number for it, this request's;
    // the core gives the run's.
    let classes = p.classes();
    for task in tasks.iter_mut().filter(|t| t.shape.class != 0) {
        task.class = Some(classes[task.shape.class as usize].clone());
    }
    if !a.name.is_empty() && (a.name.len() > MAX_NAME || a.name.chars().any(char::is_control)) {
        return Err(format!("--name: {MAX_NAME} bytes at most, and no control characters"));
    }
    for (what, given) in [("key", !a.key.is_empty()), ("name", !a.name.is_empty())] {
        if given && tasks.len() != 1 {
            return Err(format!("a {what} names one task; these lines make {}", tasks.len()));
        }
    }
    if let [one] = &mut tasks[..] {
        one.key = (!a.key.is_empty()).then(|| a.key.clone());
        one.name = (!a.name.is_empty()).then(|| a.name.clone().into_bytes());
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(lines: &str, first_line: u64, key: &str) -> proto::AddTasks {
        proto::AddTasks {
            lines: lines.as_bytes().to_vec(),
            source: "queue".into(),
            first_line,
            key: key.as_bytes().to_vec(),
            name: String::new(),
        }
    }

    #[test]
    fn lines_become_tasks_and_a_bad_one_is_named_where_the_client_sent_it() {
        let t = parse(&req("echo a\n[cores=2 after=7] echo b\n", 1, "")).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[1].line, t[1].shape.cores, t[1].needs.count()), (2, 2, 1));
        let e = parse(&req("echo a\n[cores=x] b\n", 40, "")).unwrap_err();
        assert!(e.starts_with("queue:41:"), "{e}");
    }

    #[test]
    fn a_class_goes_by_its_name_for_the_core_to_number() {
        let t = parse(&req("[class=long] a\nb\n[class=short] c\n[class=long] d\n", 1, "")).unwrap();
        let classes: Vec<_> = t.iter().map(|t| t.class.as_deref()).collect();
        assert_eq!(classes, [Some("long"), None, Some("short"), Some("long")]);
    }

    #[test]
    fn a_key_names_exactly_one_task() {
        assert_eq!(parse(&req("echo a\n", 1, "k")).unwrap()[0].key.as_deref(), Some(&b"k"[..]));
        assert!(parse(&req("a\nb\n", 1, "k")).unwrap_err().contains("a key names one task"));
    }

    #[test]
    fn a_name_names_exactly_one_task_and_is_one_line() {
        let named = |lines: &str, name: &str| parse(&proto::AddTasks { name: name.into(), ..req(lines, 1, "") });
        assert_eq!(named("echo a\n", "align 7").unwrap()[0].name.as_deref(), Some(&b"align 7"[..]));
        assert!(named("a\nb\n", "n").unwrap_err().contains("a name names one task"));
        assert!(named("a\n", "two\nlines").unwrap_err().contains("no control characters"));
        assert!(named("a\n", &"x".repeat(256)).unwrap_err().contains("255 bytes"));
    }
}

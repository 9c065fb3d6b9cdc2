//! A task on the wire, both ways: the task the leader sends into the prost frame, and the frame
//! into the task an agent's executor runs. The one place a task's shape meets the wire's fields.

use htc_core::shape::TaskShape;
use htc_core::work::TaskToRun;

use super::proto;

/// Only what an agent is told of the shape (`TaskShape::for_agent`) has a field.
impl From<TaskToRun> for proto::TaskSpec {
    fn from(s: TaskToRun) -> proto::TaskSpec {
        let TaskToRun { id, attempt, command, shell, shape } = s;
        proto::TaskSpec {
            id,
            attempt,
            command,
            shell,
            cores: shape.cores as u32,
            mem_mb: shape.mem_mb,
            timeout_ms: shape.timeout_ms,
            runtime_ms: shape.runtime_ms,
            max_output: shape.max_output_bytes(),
            gpus: shape.gpus as u32,
            priority: shape.priority as i32,
            preemptible: shape.preemptible,
            stuck_s: shape.stuck_s,
        }
    }
}

/// What the leader does not send (retries, class, exclusive, affinity: its own concerns) the
/// agent's task holds as defaults. Values past the shape's widths are clamped: the leader sends
/// none, as the task file bounds them.
impl From<proto::TaskSpec> for TaskToRun {
    fn from(t: proto::TaskSpec) -> TaskToRun {
        let shape = TaskShape {
            cores: t.cores.min(u16::MAX as u32) as u16,
            mem_mb: t.mem_mb,
            gpus: t.gpus.min(u8::MAX as u32) as u8,
            timeout_ms: t.timeout_ms,
            runtime_ms: t.runtime_ms,
            priority: t.priority.clamp(i16::MIN as i32, i16::MAX as i32) as i16,
            preemptible: t.preemptible,
            stuck_s: t.stuck_s.min(htc_core::shape::MAX_STUCK_S),
            ..TaskShape::default()
        }
        .with_max_output_bytes(t.max_output);
        TaskToRun { id: t.id, attempt: t.attempt, command: t.command, shell: t.shell, shape }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_agent_runs_asks_what_the_leader_sent() {
        let shape = TaskShape {
            cores: 3,
            mem_mb: 512,
            gpus: 2,
            timeout_ms: 9_000,
            runtime_ms: 700,
            max_output: 0x8000 | 40,
            priority: -4,
            preemptible: true,
            stuck_s: 600,
            ..TaskShape::default()
        };
        let spec = TaskToRun { id: 7, attempt: 2, command: b"x".to_vec(), shell: true, shape };
        let t = TaskToRun::from(proto::TaskSpec::from(spec));
        assert_eq!((t.id, t.attempt, t.command.as_slice(), t.shell), (7, 2, &b"x"[..], true));
        assert_eq!(t.shape, shape);
    }
}

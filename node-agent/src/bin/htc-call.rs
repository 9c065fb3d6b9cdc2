//! `htc-call`: the task command of a Python function call of the client (`slurm_htc`), run
//! from a warm interpreter of the node's agent (see `htc::warm_call`). A binary of its own,
//! small, since it starts once per call.

fn main() {
    let code = match htc::warm_call::CallArgs::parse(std::env::args_os().skip(1)) {
        Ok(a) => htc::warm_call::main(&a),
        Err(e) => {
            eprintln!("htc-call: {e} (usage: htc-call --python PY --call-script CALL --zygote WARM [--preload M,N] [--needs-memcg] [--cwd DIR] BASE)");
            2
        }
    };
    std::process::exit(code);
}

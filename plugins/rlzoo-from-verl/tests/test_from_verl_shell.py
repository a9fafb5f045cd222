"""The shell reader of `rlzoo from-verl` (plugins/rlzoo-from-verl/src/rlzoo_from_verl/shell.py).

Expected argument lists come from bash itself: :func:`bash_launch` runs the same script in a real
bash with ``python3`` / ``torchrun`` / ``ray`` replaced by functions that print the launch's
arguments, so every expansion test is checked against the shell the scripts are written for."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlzoo_from_verl import ShellError, from_verl, parse_command
from rlzoo_from_verl.shell import parse_script, read_script

from rlzoo.kernel.errors import RlzooError

ENV = {"HOME": "/home/u"}

# functions standing in for the launchers: print the module and its arguments, NUL-separated
_STUBS = r"""
_show() { printf '%s\0' "$@"; exit 0; }
python3() { while [ "$1" != "-m" ]; do shift; done; shift; _show "$@"; }
python() { python3 "$@"; }
torchrun() { while [ "$1" != "-m" ]; do shift; done; shift; _show "$@"; }
ray() { while [ "$1" != "--" ]; do shift; done; shift; "$@"; }
"""


def bash_launch(script: str, env: dict[str, str] | None = None) -> list[str]:
    """``[module, *args]`` of the launch as bash runs it (the oracle), in a directory of its own:
    the scripts' redirections (``| tee log.txt``, ``> $LOG_DIR/out.txt``) land there, not in the
    directory pytest was started from."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    with tempfile.TemporaryDirectory(prefix="bash-oracle-") as cwd:
        out = subprocess.run(
            [bash, "-c", _STUBS + script],
            env={"PATH": "/usr/bin:/bin", **(env or ENV)},
            cwd=cwd,
            capture_output=True,
            timeout=30,
            check=False,
        )
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().split("\0")[:-1]


def rlzoo_launch(
    script: str, env: dict[str, str] | None = None, fixed: dict[str, str] | None = None
) -> list[str]:
    launch = parse_script(script, env or ENV, fixed)
    return [launch.module, *launch.args]


def same_as_bash(script: str, env: dict[str, str] | None = None) -> list[str]:
    ours = rlzoo_launch(script, env)
    assert ours == bash_launch(script, env)
    return ours


# ---------------------------------------------------------------------------------------------
# what verl's scripts use, checked against bash
# ---------------------------------------------------------------------------------------------
def test_if_elif_else_with_double_brackets_and_comments():
    script = """
X=""
MODE=fsdp
if [[ -n "$X" && -d "$X" ]]; then   # -d is never evaluated: -n "" is false
    N=1
elif [[ "$MODE" == "megatron" || "$MODE" == meg* ]]; then
    N=2
else # a comment after else
    N=3
fi
if [ "$MODE" != "fsdp" ]; then N=9; fi
python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.n=$N
"""
    assert same_as_bash(script) == ["verl.trainer.main_ppo", "actor_rollout_ref.rollout.n=3"]


def test_nested_if_and_pattern_match():
    script = """
ENGINE=${1:-vllm}
if [[ $ENGINE == v* ]]; then
    if [ "$ENGINE" = "vllm" ] && [ -z "$UNSET_VAR" ]; then
        TP=2
    fi
fi
python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=$ENGINE x.tp=$TP
"""
    assert same_as_bash(script)[1:] == ["actor_rollout_ref.rollout.name=vllm", "x.tp=2"]


def test_multi_line_quoted_strings_and_continuations():
    script = """
NAME="one
two"
LOGGER='["console",
"wandb"]'
python3 -m verl.trainer.main_ppo \\
    trainer.experiment_name="$NAME" \\
    trainer.logger="$LOGGER" \\
    data.x=a\\ b
"""
    assert same_as_bash(script)[1:] == [
        "trainer.experiment_name=one\ntwo",
        'trainer.logger=["console",\n"wandb"]',
        "data.x=a b",
    ]


def test_arrays():
    script = """
COMMON=(
    data.max_prompt_length=1024   # comments inside an array
    "trainer.experiment_name=my run"
)
COMMON+=(data.shuffle=False)
N=${#COMMON[@]}
python3 -m verl.trainer.main_ppo "${COMMON[@]}" second=${COMMON[1]} count=$N first=$COMMON
"""
    assert same_as_bash(script)[1:] == [
        "data.max_prompt_length=1024",
        "trainer.experiment_name=my run",
        "data.shuffle=False",
        "second=trainer.experiment_name=my",  # unquoted: split
        "run",
        "count=3",
        "first=data.max_prompt_length=1024",
    ]


def test_parameter_expansions():
    script = """
MODEL_PATH=${MODEL_PATH:-"${HOME}/models/Qwen2.5-7B-Instruct"}
EMPTY=""
A=${EMPTY:-dflt} B=${EMPTY-dflt} C=${UNSET_C:=assigned}
D=${MODEL_PATH:+set} E=${UNSET_E:+set}
NAME=${MODEL_PATH##*/}
DIR=${MODEL_PATH%/*}
STEM=${NAME%%.*}
TAIL=${NAME#Qwen}
python3 -m verl.trainer.main_ppo a=$A b=$B c=$C c2=$C d=$D e=$E n=$NAME dir=$DIR s=$STEM t=$TAIL \\
    up=${NAME^^} low=${NAME,,} len=${#NAME}
"""
    assert same_as_bash(script)[1:] == [
        "a=dflt",
        "b=",
        "c=assigned",
        "c2=assigned",
        "d=set",
        "e=",
        "n=Qwen2.5-7B-Instruct",
        "dir=/home/u/models",
        "s=Qwen2",
        "t=2.5-7B-Instruct",
        "up=QWEN2.5-7B-INSTRUCT",
        "low=qwen2.5-7b-instruct",
        "len=19",
    ]


def test_pattern_substitution():
    script = """
CFG="actor.a=1 actor.b=2"
P=/data/a.b.c
python3 -m verl.trainer.main_ppo "${CFG//actor./critic.}" "${CFG/actor/ref}" ${P/#\\/data/\\/mnt} ${P/%.c/.d} \\
    ${P//./_} ${P//[ab]/X} "${P/*a/Z}" ${P//q/r}
"""
    assert same_as_bash(script)[1:] == [
        "critic.a=1 critic.b=2",
        "ref.a=1 actor.b=2",
        "/mnt/a.b.c",
        "/data/a.b.d",
        "/data/a_b_c",
        "/dXtX/X.X.c",
        "Z.b.c",
        "/data/a.b.c",
    ]


def test_arithmetic():
    script = """
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
NNODES=2
python3 -m verl.trainer.main_ppo \\
    a=$((max_prompt_length + max_response_length)) \\
    b=$(( (max_prompt_length + max_response_length) * 2 / 3 )) \\
    c=$((-7 / 2)) d=$((-7 % 3)) e=$((2**10)) f=$(($NNODES * 8)) g=$((${NNODES} - 3))
"""
    assert same_as_bash(script)[1:] == ["a=10240", "b=6826", "c=-3", "d=-1", "e=1024", "f=16", "g=-1"]


def test_word_splitting_export_declare_and_quotes():
    script = """
export VLLM_USE_V1=1
declare -x ENGINE=vllm
EXTRA="data.a=1   data.b=2"
export WANDB_MODE
single='$HOME stays'
python3 -m verl.trainer.main_ppo $EXTRA "quoted=$EXTRA" s="$single" e=$ENGINE ~/x t=~/y
"""
    assert same_as_bash(script)[1:] == [
        "data.a=1",
        "data.b=2",
        "quoted=data.a=1   data.b=2",
        "s=$HOME stays",
        "e=vllm",
        "/home/u/x",
        "t=/home/u/y",  # an assignment-like word: ~ after = expands too
    ]


def test_ray_job_submit_and_recipe_modules():
    script = """
RUNTIME_ENV=${RUNTIME_ENV:-"${WORKING_DIR:-$PWD}/verl/trainer/runtime_env.yaml"}
ray job submit --no-wait --runtime-env="${RUNTIME_ENV}" \\
    --working-dir "${WORKING_DIR:-.}" \\
    -- python3 -m recipe.dapo.main_dapo \\
    data.train_batch_size=512 2>&1 | tee log.txt
"""
    env = {**ENV, "PWD": "/w"}
    assert same_as_bash(script, env) == ["recipe.dapo.main_dapo", "data.train_batch_size=512"]


def test_the_oracle_writes_nothing_where_pytest_runs(tmp_path, monkeypatch):
    # a script's own redirections once left log.txt and logs/out.txt in the repository root
    monkeypatch.chdir(tmp_path)
    script = "mkdir -p logs\npython3 -m verl.trainer.main_ppo a=1 > logs/out.txt 2>&1 | tee log.txt\n"
    bash_launch(script)
    assert list(tmp_path.iterdir()) == []


def test_torchrun_python_flags_pipes_and_and_lists():
    script = """
mkdir -p /tmp && cd . && torchrun --nnodes 1 --nproc_per_node=8 --standalone -m verl.trainer.main_ppo a=1 \\
    2> /dev/null
"""
    assert same_as_bash(script) == ["verl.trainer.main_ppo", "a=1"]
    script = "HYDRA_FULL_ERROR=1 python3 -u -X faulthandler -m verl.trainer.main_ppo b=2 &> log &\nwait\n"
    assert rlzoo_launch(script) == ["verl.trainer.main_ppo", "b=2"]
    # python3 commands that run no verl module are passed over (data preparation)
    script = "python3 examples/data_preprocess/gsm8k.py --local_dir x\npython3 -m verl.trainer.main_ppo c=3\n"
    assert rlzoo_launch(script) == ["verl.trainer.main_ppo", "c=3"]


def test_functions_and_case():
    script = """
add_to_path() {
    local dir="$1"
    case ":$PYTHONPATH:" in
        *":$dir:"*) ;;
        "") export PYTHONPATH="$dir" ;;
        *) export PYTHONPATH="$dir:$PYTHONPATH" ;;
    esac
    COUNT=$#
}
function pick {
    case "$1" in
        fsdp|fsdp2) STRATEGY=fsdp2 ;;
        megatron) STRATEGY=megatron ;;
        *) STRATEGY=unknown; return ;;
    esac
    CHOSE=yes
}
dir=outer
PYTHONPATH=/a
add_to_path /repo extra
add_to_path /repo
pick megatron
pick other
MODE="x*y"
if [[ "x-y" == $MODE ]]; then M1=glob; fi
if [[ "x-y" == "$MODE" ]]; then M2=literal; else M2=no; fi
python3 -m verl.trainer.main_ppo p=$PYTHONPATH d=$dir c=$COUNT s=$STRATEGY chose=$CHOSE m=$M1$M2
"""
    assert same_as_bash(script)[1:] == ["p=/repo:/a", "d=outer", "c=1", "s=unknown", "chose=yes", "m=globno"]


def test_dollar_at_is_empty_and_noted():
    script = 'python3 -m verl.trainer.main_ppo a=1 "$@"\n'
    assert same_as_bash(script)[1:] == ["a=1"]
    cmd = parse_command(script, ENV)
    assert cmd.overrides == [("a", "1")]
    assert any("$@" in n for n in cmd.notes)


# ---------------------------------------------------------------------------------------------
# what the reader does not run: said, never guessed
# ---------------------------------------------------------------------------------------------
def test_slurm_variables_must_be_given():
    script = """
NNODES=${SLURM_JOB_NUM_NODES}
python3 -m verl.trainer.main_ppo trainer.nnodes=$NNODES trainer.n_gpus_per_node=${SLURM_GPUS_ON_NODE:-8}
"""
    with pytest.raises(
        RlzooError, match=r"SLURM_JOB_NUM_NODES, which is not set.*--env SLURM_JOB_NUM_NODES="
    ):
        parse_command(script, ENV)
    cmd = parse_command(script, {**ENV, "SLURM_JOB_NUM_NODES": "4"})
    assert cmd.overrides == [("trainer.nnodes", "4"), ("trainer.n_gpus_per_node", "8")]


def test_command_substitution_is_never_run_and_is_reported():
    script = """
NOW=$(git rev-parse --short HEAD)
UNUSED=`hostname`
python3 -m verl.trainer.main_ppo trainer.experiment_name=grpo_${NOW}
"""
    with pytest.raises(RlzooError) as e:
        parse_command(script, ENV)
    msg = str(e.value)
    assert "$NOW, set from the command substitution `$(git rev-parse --short HEAD)`" in msg
    assert "--env NOW=VALUE" in msg and "line 2" in msg
    cmd = parse_command(script, ENV, fixed={"NOW": "20250101"})
    assert cmd.overrides == [("trainer.experiment_name", "grpo_20250101")]
    assert any(
        "UNUSED not known: the command substitution `hostname` (rlzoo runs no commands)" in n
        for n in cmd.notes
    )
    assert any("NOW kept as given with --env" in n for n in cmd.notes)
    # directly in the launch: no variable to pass
    with pytest.raises(RlzooError, match=r"command substitution `\$\(whoami\)`.*edit the script"):
        parse_command("python3 -m verl.trainer.main_ppo trainer.experiment_name=$(whoami)\n", ENV)


def test_for_loops_over_known_words():
    script = """
FILES=()
for d in gsm8k math "two words"; do
    if [ "$d" = math ]; then continue; fi
    FILES+=("$HOME/data/$d.parquet")
done
for n in 1 2 3 4; do
    N=$n
    [ $n -ge 3 ] && break
done
f() { for a; do LAST=$a; done; }   # `for a; do`: the function's arguments
f x y
python3 -m verl.trainer.main_ppo "a=${FILES[*]}" b=${#FILES[@]} n=$N d=$d last=$LAST
"""
    assert same_as_bash(script)[1:] == [
        "a=/home/u/data/gsm8k.parquet /home/u/data/two words.parquet",
        "b=2",
        "n=3",
        "d=two",  # unquoted: split
        "words",
        "last=y",
    ]


def test_a_launch_inside_a_for_loop_converts_the_first_and_says_so():
    script = "for lr in 1e-6 2e-6; do\n  python3 -m verl.trainer.main_ppo lr=$lr\ndone\n"
    assert same_as_bash(script)[1:] == ["lr=1e-6"]
    assert any(
        "for loop over 2 words; the first launch (lr='1e-6'" in n for n in parse_script(script, ENV).notes
    )


def test_a_for_loop_over_a_command_substitution_that_only_unsets():
    script = """
for v in $(env | awk -F= '/^SLURM_/{print $1}'); do
    unset "$v"
done
NODES=${NODES:-1}
python3 -m verl.trainer.main_ppo trainer.nnodes=$NODES data.path=$HOME/d.parquet x=$SLURM_JOB_ID
"""
    # NODES was unset before the loop and stays unset; HOME and SLURM_JOB_ID may be unset by it:
    # both are reported at once, each with its fix
    env = {**ENV, "SLURM_JOB_ID": "7"}
    with pytest.raises(RlzooError) as e:
        parse_command(script, env)
    msg = str(e.value)
    assert "reads 2 values rlzoo does not know" in msg
    assert "$HOME, which the for loop at line 2 may unset" in msg
    assert "`--env HOME=VALUE --env SLURM_JOB_ID=VALUE`" in msg
    cmd = parse_command(script, env, fixed={"HOME": "/h", "SLURM_JOB_ID": ""})
    assert cmd.overrides == [("trainer.nnodes", "1"), ("data.path", "/h/d.parquet"), ("x", "")]
    # what the script sets after the loop is known
    assert rlzoo_launch(script.replace("NODES=", "HOME=/x\nSLURM_JOB_ID=1\nNODES="), env)[2:] == [
        "data.path=/x/d.parquet",
        "x=1",
    ]


def test_unset_keeps_a_variable_given_with_env():
    cmd = parse_command(
        "unset MODEL\npython3 -m verl.trainer.main_ppo m=$MODEL\n", ENV, fixed={"MODEL": "/m"}
    )
    assert cmd.overrides == [("m", "/m")]
    assert any("MODEL kept as given with --env (the script's unset skipped)" in n for n in cmd.notes)


def test_here_documents_are_data():
    script = """
cat > /dev/null <<EOF
unquoted: $HOME "a quote ( never closed
EOF
cat > /dev/null <<'END' ; X=1
it's quoted: $(never run) `either`
END
	cat > /dev/null <<-EOF
	tabs are stripped before the delimiter with <<-
	EOF
cat >/dev/null <<A; cat >/dev/null <<"B"
first body
A
second body
B
python3 -m verl.trainer.main_ppo x=$X y=after
"""
    assert same_as_bash(script)[1:] == ["x=1", "y=after"]
    # a body never closed runs to the end of the script, as in bash
    with pytest.raises(RlzooError, match="found no verl launch"):
        parse_command("cat <<EOF\npython3 -m verl.trainer.main_ppo a=1\n", ENV)


def test_slices_of_strings_arrays_and_arguments():
    script = """
X=abcdef
A=(a b c d)
f() { python3 -m verl.trainer.main_ppo "${@:2}" "s=${X:2} ${X: -2} ${X:1:2} ${X:1:-1} [${X: -10}]" \\
      "a=${A[@]:1:2}|${A[*]: -1}" n=$# "${@:2:1}"; }
f first k=1 k=2
"""
    assert same_as_bash(script)[1:] == [
        "k=1",
        "k=2",
        "s=cdef ef bc bcde []",
        "a=b",  # "${A[@]...}" inside a word: one field per element
        "c|d",
        "n=3",
        "k=1",
    ]
    # at the top level "${@:2}" is empty (and said so); ${@:0} holds the script's own path
    assert rlzoo_launch('python3 -m verl.trainer.main_ppo a=1 "${@:2}"\n') == ["verl.trainer.main_ppo", "a=1"]
    with pytest.raises(RlzooError, match=r"\$\{@:0\} \(it holds \$0, the script's own path\)"):
        parse_command('python3 -m verl.trainer.main_ppo "${@:0}"\n', ENV)
    with pytest.raises(ShellError, match="substring expression < 0"):
        parse_command("X=abc\nY=${X:2:-2}\n", ENV)


def test_text_after_the_launch_is_never_lexed():
    script = "python3 -m verl.trainer.main_ppo a=1\necho 'never closed\n"
    assert same_as_bash(script)[1:] == ["a=1"]
    script = "python3 -m verl.trainer.main_ppo a=1\nfor ((i=0;;)); do $((1/0)); done\ncat <<EOF\n${X:=1}\n"
    assert rlzoo_launch(script)[1:] == ["a=1"]


def test_refusals_say_what_to_do():
    with pytest.raises(
        ShellError, match=r"line 1: \$\(\(`8 / sp`\)\): division by zero \(sp: empty or unset"
    ):
        parse_command("N=$((8 / sp))\nsp=4\n", ENV)
    with pytest.raises(ShellError, match=r"`eval \"\$X\"` runs text rlzoo cannot see"):
        parse_command('eval "$X"\n', ENV)
    script = "python3 -m verl.trainer.main_ppo \\\n    a=1 \\  # a comment\n    b=2\n"
    with pytest.raises(RlzooError, match=r"argument ' ': a backslash before a space.*launch at line 1"):
        parse_command(script, ENV)


def test_a_needed_file_test_is_refused_a_short_circuited_one_is_not():
    script = """
CKPT=${CKPT:-/ckpt}
if [ -d "$CKPT" ]; then RESUME=auto; else RESUME=disable; fi
python3 -m verl.trainer.main_ppo trainer.resume_mode=$RESUME
"""
    with pytest.raises(ShellError, match=r"line 3: the file test -d '/ckpt' depends on the machine"):
        parse_command(script, ENV)


@pytest.mark.parametrize(
    ("script", "line", "what"),
    [
        ("for ((i = 0; i < 2; i++)); do\n  echo $i\ndone\n", 1, "an arithmetic for loop"),
        ("for x in $(ls); do\n  X=$x\ndone\n", 1, "a for loop over the command substitution `$(ls)`"),
        ("for x in a; do break 2; done\n", 1, "`break 2` (more than one loop level)"),
        ("continue\n", 1, "`continue` outside a for loop"),
        ("A=1\nwhile true; do :; done\n", 2, "a while loop: rlzoo cannot know how often it runs"),
        ("{ X=1; }\n", 1, "a { ... } group"),
        ("f() ( X=1 )\n", 1, "a function body other than { ... }"),
        ('case "$X" in\n a) Y=1 ;;\n', 3, "a case pattern must end with ')'"),  # no esac
        ('case "$(uname)" in\n a) Y=1 ;;\nesac\n', 1, "a case on the command substitution"),
        ("return 1\n", 1, "`return` outside a function"),
        ("cat > f <<EOF\n${X:=1}\nEOF\n", 1, "a here-document whose body holds '${X:='"),
        ("source ./env.sh\n", 1, "`source`: `source ./env.sh` reads another file"),
        (". ./env.sh\n", 1, "`.`: `. ./env.sh` reads another file"),
        ('eval "$(ls)"\n', 1, "`eval`"),
        ("source ./venv/bin/activate-extra\n", 1, "`source`"),
        ("(cd x && ls)\n", 1, "a subshell"),
        ("diff <(ls a) <(ls b)\n", 1, "process substitution"),
        ('X="never closed\n', 1, "never closed"),
        ("X=${Y@Q}\n", 1, "${Y@Q}"),
        ("X=$'\\n'\n", 1, "quoting"),
        ("A=1\nelse\n", 2, "'else' without a matching if"),
        ("if [ a = a ]; then\n X=1\n", 4, "the script ends before elif / else / fi"),
        ("if grep -q x f; then X=1; fi\n", 1, "an if on the exit status of a command"),
        ('if [ -z "$M" ]; then echo usage; exit 1; fi\n', 1, "the script exits here"),
    ],
)
def test_unsupported_constructs_say_where_and_what(script, line, what):
    with pytest.raises(ShellError) as e:
        parse_command(script + "python3 -m verl.trainer.main_ppo a=1\n", ENV)
    assert str(e.value).startswith(f"from-verl: unsupported shell construct at line {line}: ")
    assert what in str(e.value)


def test_what_follows_the_launch_is_never_read():
    script = "X=1\npython3 -m verl.trainer.main_ppo a=$X\nfor f in *; do rm $f; done\ncat <<EOF\n"
    assert rlzoo_launch(script) == ["verl.trainer.main_ppo", "a=1"]


def test_no_launch_says_what_it_looked_for():
    with pytest.raises(RlzooError, match=r"found no verl launch.*python commands that run no verl module"):
        parse_command("python3 main_ppo_split.py a=1\n", ENV)


def test_files_that_are_not_scripts(tmp_path: Path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x7fELF\x00\x01\x02")
    with pytest.raises(RlzooError, match=r"model.bin is a binary file"):
        from_verl(str(binary))
    latin = tmp_path / "latin1.sh"
    latin.write_bytes("X=caf\xe9\n".encode("latin-1"))
    with pytest.raises(RlzooError, match=r"is not UTF-8 text \(byte 0xe9 at offset 5\)"):
        from_verl(str(latin))
    with pytest.raises(RlzooError, match=r"nothere.sh does not exist; give a verl launch script"):
        from_verl(str(tmp_path / "nothere.sh"))
    with pytest.raises(RlzooError, match=r"is a directory"):
        from_verl(str(tmp_path))


def test_a_fifo_or_a_device_is_named_and_never_read(tmp_path: Path):
    """Issue 39, finding 11. Before: "does not exist" for both (and a read of /dev/zero would never end)."""
    import os

    fifo = tmp_path / "launch.sh"
    os.mkfifo(fifo)  # nobody writes into it: opening it for reading would block forever
    with pytest.raises(
        RlzooError, match=r"launch.sh is a FIFO \(named pipe\), not a regular file; it was not read"
    ):
        from_verl(str(fifo))
    with pytest.raises(RlzooError, match=r"/dev/zero is a character device, not a regular file"):
        from_verl("/dev/zero")
    big = tmp_path / "big.sh"
    big.write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    with pytest.raises(RlzooError, match=r"big.sh is larger than 1,048,576 bytes"):
        from_verl(str(big))


def test_doubling_a_variable_is_refused_by_name_before_it_grows(tmp_path: Path):
    """Issue 39, finding 9: 24 doublings of a 10-character value (10 x 2**24 = 168 MB). Before: a
    168 MB recipe and 1 GB of memory. Now: the doubling that passes 1 MiB (the 17th: 10 x 2**17 =
    1,310,720 characters) is refused by its variable and line, and nothing is written."""
    import time

    script = tmp_path / "run.sh"
    lines = [
        "A=0123456789",
        *["A=$A$A"] * 24,
        "python3 -m verl.trainer.main_ppo data.train_files=/d/$A.parquet",
    ]
    script.write_text("\n".join(lines) + "\n")
    out = tmp_path / "recipe.yaml"
    t0 = time.perf_counter()
    with pytest.raises(
        RlzooError, match=r"line 18: A would hold 1,310,720 characters, more than the 1,048,576"
    ):
        from_verl(str(script), out)
    assert time.perf_counter() - t0 < 5 and not out.exists()
    script.write_text("\n".join(["A=0123456789", *["A=$A$A"] * 10, lines[-1]]) + "\n")
    _, text = from_verl(str(script))  # 10,240 characters: a value a script may hold
    assert "0123456789" * 1024 in text


# ---------------------------------------------------------------------------------------------
# never anything but its own error
# ---------------------------------------------------------------------------------------------
_FRAGMENTS = [
    "X=1",
    "X=",
    "Y=$X",
    "A=(a b",
    ")",
    "A=(",
    '"',
    "'",
    "`",
    "$(",
    "$((",
    "${",
    "}",
    "))",
    "$",
    "\\",
    "\n",
    " ",
    ";",
    "&&",
    "||",
    "|",
    "&",
    "(",
    "<",
    ">",
    "2>&1",
    "<<",
    "#",
    "if",
    "then",
    "elif",
    "else",
    "fi",
    "[[",
    "]]",
    "[",
    "]",
    "-n",
    "-d",
    "==",
    "!=",
    "-eq",
    "!",
    "export",
    "declare",
    "unset",
    "for",
    "case",
    "python3",
    "-m",
    "verl.trainer.main_ppo",
    "torchrun",
    "ray job submit --",
    "a=b",
    "$@",
    "${X:-d}",
    "${X#*}",
    "${A[@]}",
    "${#A[@]}",
    "$((1/0))",
    "$((X*2))",
    "~",
    "exit",
    "eval",
    "**",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=40).map(" ".join) | st.text(max_size=300))
def test_reader_raises_only_its_own_error_on_any_text(text):
    with contextlib.suppress(RlzooError):  # anything else fails the test
        parse_command(text, ENV)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_reader_raises_only_its_own_error_on_any_bytes(data):
    with contextlib.suppress(RlzooError):  # anything else fails the test
        parse_command(read_script(data, "x.sh"), ENV)


LAUNCH = "python3 -m verl.trainer.main_ppo trainer.default_local_dir=$CKPT trainer.experiment_name=$EXP\n"


@pytest.mark.parametrize(
    "setup",
    [
        'eval "$(conda shell.bash hook)"\nconda activate verl\n',
        'eval "$(/opt/miniconda3/bin/conda shell.bash hook 2> /dev/null)"\nconda activate /envs/v\n',
        'eval "$(micromamba shell hook -s bash)"\nmicromamba activate rl\n',
        "source activate verl\nconda deactivate\n",
        "source /work/.venv/bin/activate\n. ~/envs/rl/bin/activate\n",
    ],
)
def test_environment_activation_is_skipped_and_said(setup):
    cmd = parse_command(setup + "CKPT=/c\nEXP=e\n" + LAUNCH, ENV)
    assert dict(cmd.overrides)["trainer.default_local_dir"] == "/c"
    activated = [n for n in cmd.notes if "activates a Python environment: skipped" in n]
    assert len(activated) == setup.count("\n"), cmd.notes


def test_an_eval_that_is_not_an_activation_is_still_refused():
    with pytest.raises(ShellError, match=r"line 1: `eval`: `eval \"\$\(conda shell.bash hook\)\" x`"):
        parse_command('eval "$(conda shell.bash hook)" x\n' + LAUNCH, ENV)
    with pytest.raises(ShellError, match=r"`source`: `source ./activate.sh` reads another file"):
        parse_command("source ./activate.sh\n" + LAUNCH, ENV)


def test_pwd_is_the_directory_from_verl_runs_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = parse_command('PROJECT_DIR="$(pwd)"\nCKPT=$PROJECT_DIR/ckpt\nEXP=`pwd -P`\n' + LAUNCH, ENV)
    got = dict(cmd.overrides)
    assert got["trainer.default_local_dir"] == f"{tmp_path}/ckpt"
    assert got["trainer.experiment_name"] == str(tmp_path)
    assert any(f"$(pwd) read as {tmp_path} (the directory from-verl runs in)" in n for n in cmd.notes)


def test_date_is_the_time_of_the_conversion(monkeypatch):
    import time

    fixed = 1_700_000_000.25  # 2023-11-14 22:13:20.25 UTC
    monkeypatch.setattr(time, "time", lambda: fixed)
    script = 'CKPT=/c\nEXP=run_$(date -u +%Y%m%d_%H%M%S)_$(date -u "+%s.%N")\n' + LAUNCH
    cmd = parse_command(script, ENV)
    assert dict(cmd.overrides)["trainer.experiment_name"] == "run_20231114_221320_1700000000.250000000"
    assert any("the time of this conversion, not of the run" in n for n in cmd.notes)
    # an option the reader does not know, a nested expansion: unknown as before, named
    for sub in ("$(date -d yesterday +%F)", "$(date +$FMT)", "$(hostname)"):
        with pytest.raises(RlzooError, match=r"command substitution"):
            parse_command(f"CKPT=/c\nEXP={sub}\n" + LAUNCH, ENV)


def test_date_matches_gnu_date_where_installed():
    date = shutil.which("date")
    if date is None:
        pytest.skip("no date command on this machine")
    fmt = "+%Y-%m-%d %H:%M:%S %a %b %j"
    launch = 'python3 -m verl.trainer.main_ppo trainer.experiment_name="$EXP"\n'
    cmd = parse_command(f'EXP="$(date -u "{fmt}")"\n' + launch, ENV)
    ours = dict(cmd.overrides)["trainer.experiment_name"]
    theirs = subprocess.run([date, "-u", fmt], capture_output=True, text=True, check=True).stdout.strip()
    assert ours[:16] == theirs[:16]  # same minute (the two clocks are read a moment apart)
    assert ours[20:] == theirs[20:]


def test_a_recipe_past_its_size_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The last bound, on what would be written (values each under their limit, in many keys): shown
    with the limit lowered to 100 characters, as a real recipe is longer than that."""
    import importlib

    monkeypatch.setattr(importlib.import_module("rlzoo_from_verl.convert"), "MAX_RECIPE_CHARS", 100)
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo data.train_files=/d/train.parquet\n")
    with pytest.raises(
        RlzooError, match=r"characters, more than the 100 a recipe may be; nothing was written"
    ):
        from_verl(str(script), tmp_path / "recipe.yaml")
    assert not (tmp_path / "recipe.yaml").exists()

"""Collimate's code interpreter server, inside the guest (docs/code.md).

Stateful kernels behind one HTTP server on port 49999, in the protocol E2B's `@e2b/code-interpreter`
speaks to its own template, so that SDK runs unchanged through the ports proxy; the host's
`/v1/sandboxes/{id}/code` routes reach the same server the same way.

  GET  /health                       "OK" once the default context is up
  POST /execute                      {code, context_id?, language?, env_vars?, seed?} -> NDJSON lines:
                                     stdout/stderr {text}, result {..., is_main_result},
                                     error {name, value, traceback}, number_of_executions
                                     {execution_count}, end_of_execution (E2B's shapes);
                                     `?format=mime` gives results as {data: MIME bundle} instead
  GET  /contexts                     [{id, language, cwd}]
  POST /contexts                     {language?, cwd?} -> the context
  POST /contexts/{id}/restart        a fresh kernel, same id
  POST /contexts/{id}/interrupt      SIGINT to the running cell (ours; E2B interrupts on disconnect)
  DELETE /contexts/{id}

Python contexts are Jupyter kernels (Debian's ipykernel), driven with jupyter_client; JavaScript
contexts are `kernel.js` on the image's Node.js, driven over a pipe in JSON lines. One cell runs at
a time per context; a client that goes away mid-cell interrupts it, as E2B's does. Standard library
only, apart from jupyter_client for Python contexts (imported when the first one starts), so the
same file serves an image that has only Node.js and python3.

While a cell runs, BUSY_FILE holds how many do: the host's idle pause reads it (the server lives in
a cgroup of its own, outside the agent's /execs, so an idle kernel does not keep a sandbox awake).
"""
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("COLLIMATE_CODE_PORT", "49999"))
HERE = os.path.dirname(os.path.abspath(__file__))
# Where the server says how it is doing (ready, busy): beside it unless told (tests on a host).
STATE_DIR = os.environ.get("COLLIMATE_CODE_STATE_DIR", HERE)
BUSY_FILE = os.path.join(STATE_DIR, "busy")
# Seconds between keepalive lines while a cell is silent: a write is how a vanished client is noticed.
KEEPALIVE_SECS = 5
KERNEL_START_SECS = float(os.environ.get("COLLIMATE_CODE_KERNEL_START_SECS", "180"))

# IPython colours its tracebacks; the `mime` format (the host's API) gives them as plain text.
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

LANGUAGE_ALIASES = {"python": "python", "python3": "python", "py": "python", "ipython": "python",
                    "javascript": "javascript", "js": "javascript", "node": "javascript", "nodejs": "javascript"}


# The host's warm-up of a pooled sandbox (`{"warm": true}`): a silent cell that still goes the way a
# user's does — a value through every display formatter and published, output published — so the
# first real cell after a claim finds those paths translated (TCG translates afresh in each VMM).
WARM_UP = {
    "python": "from IPython.display import display as _c_display\n_c_display(1 + 1)\nprint('', end='')\ndel _c_display\n",
    "javascript": "display(1 + 1); console.log('')",
}


class RequestError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def python_available():
    import importlib.util
    return importlib.util.find_spec("ipykernel") is not None and importlib.util.find_spec("jupyter_client") is not None


def node_available():
    return shutil.which("node") is not None


def languages():
    out = []
    if python_available():
        out.append("python")
    if node_available():
        out.append("javascript")
    return out


def normalize_language(name):
    if name is None or name == "":
        langs = languages()
        if not langs:
            raise RequestError(500, "This sandbox has no kernel: its image carries neither ipykernel (Python) nor node (JavaScript).")
        return langs[0]
    lang = LANGUAGE_ALIASES.get(str(name).lower())
    if lang is None:
        raise RequestError(400, f"Language {name!r} is not served here: give python or javascript.")
    if lang not in languages():
        need = "python3-ipykernel and python3-jupyter-client" if lang == "python" else "node on PATH"
        raise RequestError(400, f"Language {lang} is not available in this sandbox: its image lacks {need}.")
    return lang


def default_cwd():
    return "/home/user" if os.path.isdir("/home/user") else os.path.expanduser("~") or "/"


# Cells in flight across all contexts, mirrored into BUSY_FILE for the host's idle pause.
_busy = 0
_busy_lock = threading.Lock()


def _set_busy(delta):
    global _busy
    with _busy_lock:
        _busy += delta
        try:
            with open(BUSY_FILE + ".tmp", "w") as f:
                f.write(str(_busy))
            os.replace(BUSY_FILE + ".tmp", BUSY_FILE)
        except OSError:
            pass


def seed_snippet(language, seed):
    """Code run silently before a seeded cell: the language's own generators start from the seed."""
    if language == "python":
        return ("import random as _c_r, sys as _c_s\n"
                f"_c_r.seed({seed})\n"
                "if 'numpy' in _c_s.modules:\n"
                f"    _c_s.modules['numpy'].random.seed({seed % (2 ** 32)})\n"
                "del _c_r, _c_s\n")
    return None


# What a kernel must not inherit from the server: the seed preload and its variables (a kernel is
# seeded per cell, on request) and the server's own settings.
SERVER_ONLY_ENV = ("LD_PRELOAD", "COLLIMATE_SEED", "COLLIMATE_SEED_LINEAGE", "COLLIMATE_CODE_PORT", "COLLIMATE_CODE_STATE_DIR")


def kernel_env():
    env = dict(os.environ)
    for k in SERVER_ONLY_ENV:
        env.pop(k, None)
    return env


def kernel_died():
    """The error a cell ends with when its kernel process is gone."""
    return ("error", {"name": "KernelDied", "value": "The kernel died while the cell ran (out of memory, or it was killed); its state is lost. Restart the context.", "traceback": ""})


def env_snippet(language, env):
    """Code setting (or, with None values, removing) environment variables in the kernel."""
    if not env:
        return None
    if language == "python":
        return ("import os as _c_os, json as _c_json\n"
                f"for _c_k, _c_v in _c_json.loads({json.dumps(json.dumps(env))}).items():\n"
                "    _c_os.environ.pop(_c_k, None) if _c_v is None else _c_os.environ.__setitem__(_c_k, _c_v)\n"
                "del _c_os, _c_json\n")
    return None


class KernelGone(Exception):
    """A call on a Python kernel that has been shut down."""


class Driver:
    """One thread with one event loop for everything a Python kernel's jupyter_client objects do.

    jupyter_client 7 drives its kernels with pyzmq's asyncio sockets from whichever thread calls it,
    each thread on an event loop of its own, and a pyzmq asyncio socket belongs to the loop it is
    used on (pyzmq's `_get_loop` re-registers the socket on every change of loop, leaving the old
    loop's registration and its pending futures behind). This server answers each request on a new
    thread: without a driver, a kernel's sockets moved to a new loop at every request. With it, they
    stay on this one thread's loop for the kernel's life."""

    def __init__(self, name):
        self.calls = queue.Queue()
        self.stopped = False
        self.lock = threading.Lock()  # a call is queued before the stop or refused
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self):
        import asyncio
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        while True:
            item = self.calls.get()
            if item is None:
                loop.close()
                return
            fn, box, done = item
            try:
                box.append((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box.append((False, e))
            done.set()

    def call(self, fn):
        """fn() on the driver's thread; its value, or its exception raised here."""
        if threading.current_thread() is self.thread:
            return fn()
        box, done = [], threading.Event()
        with self.lock:
            if self.stopped:
                raise KernelGone()
            self.calls.put((fn, box, done))
        done.wait()
        ok, value = box[0]
        if ok:
            return value
        raise value

    def stop(self):
        with self.lock:
            if not self.stopped:
                self.stopped = True
                self.calls.put(None)


class PythonKernel:
    """An ipykernel, started and driven by jupyter_client on a Driver of its own."""

    language = "python"

    def __init__(self, cwd):
        self.cwd = cwd
        self.km = None
        self.kc = None
        self.driver = Driver("kernel")
        try:
            self.driver.call(self.start)
        except BaseException:
            self.shutdown()
            raise

    def start(self):
        from jupyter_client.manager import KernelManager
        self.km = KernelManager(kernel_name="python3")
        env = kernel_env()
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        # ipykernel's debugger (debugpy) otherwise warns on stderr about frozen modules at every start.
        env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        self.km.start_kernel(cwd=self.cwd, env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=KERNEL_START_SECS)
        with open(os.path.join(HERE, "python_setup.py")) as f:
            setup = f.read()
        for kind, payload in self.run(setup, silent=True):
            if kind == "error":
                print(f"python_setup.py failed: {payload['name']}: {payload['value']}", file=sys.stderr, flush=True)

    def alive(self):
        try:
            return self.km is not None and self.driver.call(self.km.is_alive)
        except KernelGone:
            return False

    def chdir(self, cwd):
        self.cwd = cwd
        for _ in self.run(f"import os as _c_os\n_c_os.chdir({cwd!r})\ndel _c_os\n", silent=True):
            pass

    def interrupt(self):
        try:
            self.driver.call(self.km.interrupt_kernel)
        except KernelGone:
            pass

    def shutdown(self):
        def stop():
            try:
                if self.kc:
                    self.kc.stop_channels()
                if self.km:
                    self.km.shutdown_kernel(now=True)
            except Exception:  # noqa: BLE001 - a kernel that is already gone is shut down
                pass
        try:
            self.driver.call(stop)
        except KernelGone:
            pass
        self.driver.stop()

    def run(self, code, silent=False):
        """Yields (kind, payload) for one cell: stream, result, error, count; ends at the kernel's idle."""
        try:
            msg_id = self.driver.call(lambda: self.kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=True))
        except KernelGone:
            yield kernel_died()
            return
        while True:
            try:
                msg = self.driver.call(lambda: self.kc.get_iopub_msg(timeout=1))
            except queue.Empty:
                if not self.alive():
                    yield kernel_died()
                    return
                yield ("idle_tick", None)
                continue
            except KernelGone:
                yield kernel_died()
                return
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            t = msg["msg_type"]
            c = msg["content"]
            if t == "stream":
                yield (c.get("name", "stdout"), c.get("text", ""))
            elif t == "execute_input":
                yield ("count", c.get("execution_count"))
            elif t == "execute_result":
                yield ("result", {"main": True, "data": c.get("data", {})})
            elif t == "display_data":
                yield ("result", {"main": False, "data": c.get("data", {})})
            elif t == "error":
                yield ("error", {"name": c.get("ename", ""), "value": c.get("evalue", ""), "traceback": "\n".join(c.get("traceback", []))})
            elif t == "status" and c.get("execution_state") == "idle":
                return


class NodeKernel:
    """kernel.js on the image's Node.js: commands in on stdin, events out on a pipe of their own."""

    language = "javascript"

    def __init__(self, cwd):
        self.cwd = cwd
        self.proc = None
        self.events = None
        self.start()

    def start(self):
        r, w = os.pipe()
        env = kernel_env()
        env["COLLIMATE_KERNEL_FD"] = str(w)
        self.proc = subprocess.Popen(["node", os.path.join(HERE, "kernel.js")], cwd=self.cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(w,), start_new_session=True)
        os.close(w)
        self.events = queue.Queue()
        reader = os.fdopen(r, "r", encoding="utf-8")

        def pump(events=self.events):
            for line in reader:
                try:
                    events.put(json.loads(line))
                except ValueError:
                    pass
            events.put(None)

        threading.Thread(target=pump, daemon=True).start()
        ready = self.events.get(timeout=KERNEL_START_SECS)
        if not ready or ready.get("type") != "ready":
            raise RuntimeError("the JavaScript kernel did not start")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def chdir(self, cwd):
        self.cwd = cwd
        for _ in self.run(f"process.chdir({json.dumps(cwd)})", silent=True):
            pass

    def interrupt(self):
        try:
            self.proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass

    def shutdown(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def run(self, code, silent=False, seed=None):
        cell = str(uuid.uuid4())
        cmd = {"op": "execute", "id": cell, "code": code, "silent": silent}
        if seed is not None:
            cmd["seed"] = str(seed)
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        while True:
            try:
                ev = self.events.get(timeout=1)
            except queue.Empty:
                if not self.alive():
                    yield kernel_died()
                    return
                yield ("idle_tick", None)
                continue
            if ev is None:
                yield kernel_died()
                return
            if ev.get("id") != cell:
                continue
            t = ev.get("type")
            if t in ("stdout", "stderr"):
                yield (t, ev.get("text", ""))
            elif t == "count":
                yield ("count", ev.get("execution_count"))
            elif t == "result":
                yield ("result", {"main": bool(ev.get("main")), "data": ev.get("data", {})})
            elif t == "error":
                yield ("error", {"name": ev.get("name", ""), "value": ev.get("value", ""), "traceback": ev.get("traceback", "")})
            elif t == "done":
                return


# A started Python kernel kept aside for the next context or restart: a new one takes ten seconds
# and more under TCG, a spare is taken at once (and, made before the checkpoint, every sandbox of the
# template has one). JavaScript kernels start in about a second and are not kept.
_spares = {}
_spares_lock = threading.Lock()
# Tries at the server's start to have a spare before it says it is ready (see main).
SPARE_START_ATTEMPTS = 3


def _new_kernel(language, cwd):
    return (PythonKernel if language == "python" else NodeKernel)(cwd)


def fill_spare(language):
    if language != "python":
        return
    with _spares_lock:
        if language in _spares:
            return
        _spares[language] = None  # being made
    try:
        kernel = _new_kernel(language, default_cwd())
    except Exception as e:  # noqa: BLE001 - the next context starts its own
        print(f"starting a spare {language} kernel failed: {e}", file=sys.stderr, flush=True)
        with _spares_lock:
            _spares.pop(language, None)
        return
    with _spares_lock:
        _spares[language] = kernel


def take_kernel(language, cwd):
    """A kernel for a new context or a restart: the spare, moved to `cwd`, else a new one. A spare
    still starting is waited for: two kernels starting at once in one vCPU take twice as long each."""
    deadline = time.monotonic() + KERNEL_START_SECS
    while True:
        with _spares_lock:
            making = language in _spares and _spares[language] is None
            kernel = _spares.get(language)
            if kernel is not None:
                del _spares[language]
        if not making or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if kernel is not None and kernel.alive():
        kernel.chdir(cwd)
    else:
        kernel = _new_kernel(language, cwd)
    threading.Thread(target=fill_spare, args=(language,), daemon=True).start()
    return kernel


class Context:
    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.kernel = take_kernel(language, cwd)

    def view(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def cell(self, code, env=None, seed=None, silent=False):
        """Runs one cell, yielding (kind, payload); before it, silently, the env and seed snippets.
        A silent cell is not counted and shows nothing (the host's warm-up of a pooled sandbox)."""
        with self.lock:
            _set_busy(1)
            try:
                if self.language == "python":
                    for pre in (env_snippet("python", env), seed_snippet("python", seed) if seed is not None else None):
                        if pre:
                            for _ in self.kernel.run(pre, silent=True):
                                pass
                    yield from self.kernel.run(code, silent=silent)
                else:
                    if env:
                        self.kernel.proc.stdin.write((json.dumps({"op": "env", "env": env}) + "\n").encode())
                        self.kernel.proc.stdin.flush()
                    yield from self.kernel.run(code, silent=silent, seed=seed)
            finally:
                _set_busy(-1)


contexts = {}
defaults = {}
contexts_lock = threading.Lock()


def create_context(language, cwd):
    cwd = cwd or default_cwd()
    if not os.path.isdir(cwd):
        raise RequestError(400, f"cwd {cwd!r} is not a directory in the sandbox: create it first, or give another.")
    ctx = Context(language, cwd)
    with contexts_lock:
        contexts[ctx.id] = ctx
    return ctx


def default_context(language):
    with contexts_lock:
        ctx = contexts.get(defaults.get(language, ""))
    if ctx:
        return ctx
    ctx = create_context(language, None)
    with contexts_lock:
        if language in defaults and defaults[language] in contexts:
            # Another request made it first: keep that one.
            other = contexts[defaults[language]]
            del contexts[ctx.id]
            ctx.kernel.shutdown()
            return other
        defaults[language] = ctx.id
    return ctx


def e2b_result(main, data):
    """A result in E2B's shape: well-known MIME types as named fields, the rest under extra."""
    data = dict(data)
    out = {"type": "result", "is_main_result": main}
    names = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
             "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
             "application/json": "json", "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart"}
    for mime, name in names.items():
        if mime in data:
            out[name] = data.pop(mime)
    text = out.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        out["text"] = text[1:-1]
    if data:
        out["extra"] = data
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "collimate-code/1"

    def log_message(self, fmt, *args):  # quiet: the host keeps its own log
        pass

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_text(self, status, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n == 0:
            return {}
        try:
            body = json.loads(self.rfile.read(n))
        except ValueError:
            raise RequestError(400, "The body is not JSON.")
        if not isinstance(body, dict):
            raise RequestError(400, "The body must be a JSON object.")
        return body

    def route(self, method):
        path, _, query = self.path.partition("?")
        parts = [p for p in path.split("/") if p]
        try:
            if method == "GET" and parts == ["health"]:
                return self.send_json(200, "OK")
            if method == "POST" and parts == ["execute"]:
                return self.execute(self.body(), "format=mime" in query.split("&"))
            if parts == ["contexts"] and method == "GET":
                with contexts_lock:
                    return self.send_json(200, [c.view() for c in contexts.values()])
            if parts == ["contexts"] and method == "POST":
                b = self.body()
                ctx = create_context(normalize_language(b.get("language")), b.get("cwd"))
                return self.send_json(200, ctx.view())
            if len(parts) >= 2 and parts[0] == "contexts":
                with contexts_lock:
                    ctx = contexts.get(parts[1])
                if ctx is None:
                    return self.send_text(404, f"Context {parts[1]} not found")
                if method == "DELETE" and len(parts) == 2:
                    with contexts_lock:
                        contexts.pop(ctx.id, None)
                        for lang, cid in list(defaults.items()):
                            if cid == ctx.id:
                                del defaults[lang]
                    ctx.kernel.shutdown()
                    return self.send_json(200, None)
                if method == "POST" and parts[2:] == ["restart"]:
                    # Stopped first, not interrupted: a cell deaf to interrupts holds the context's
                    # lock until its kernel is gone (it then ends with KernelDied).
                    ctx.kernel.shutdown()
                    with ctx.lock:
                        ctx.kernel = take_kernel(ctx.language, ctx.cwd)
                    return self.send_json(200, None)
                if method == "POST" and parts[2:] == ["interrupt"]:
                    ctx.kernel.interrupt()
                    return self.send_json(200, None)
            return self.send_text(404, f"No route {method} {path}")
        except RequestError as e:
            return self.send_text(e.status, str(e))
        except (BrokenPipeError, ConnectionResetError):
            return None
        except Exception as e:  # noqa: BLE001 - reported to the caller, the server stays up
            return self.send_text(500, f"{type(e).__name__}: {e}")

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def execute(self, b, mime):
        warm = b.get("warm") is True
        code = "" if warm else b.get("code")
        if not isinstance(code, str):
            raise RequestError(400, "code is required: the cell's source, a string.")
        if b.get("context_id") and b.get("language"):
            raise RequestError(400, "Only one of context_id or language can be provided")
        env = b.get("env_vars") or None
        if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise RequestError(400, "env_vars must be an object of strings.")
        seed = b.get("seed")
        if seed is not None:
            try:
                seed = int(seed)
            except (TypeError, ValueError):
                raise RequestError(400, "seed must be an unsigned 64-bit integer as a decimal string.")
        if b.get("context_id"):
            with contexts_lock:
                ctx = contexts.get(b["context_id"])
            if ctx is None:
                return self.send_text(404, f"Context {b['context_id']} not found")
        else:
            ctx = default_context(normalize_language(b.get("language")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        last_write = time.monotonic()

        def line(obj):
            data = (json.dumps(obj) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        if warm:
            code = WARM_UP[ctx.language]
        cell = ctx.cell(code, env, seed, silent=warm)
        try:
            if mime:
                line({"type": "context", "id": ctx.id, "language": ctx.language})
            for kind, payload in cell:
                now = time.monotonic()
                if kind == "idle_tick":
                    if now - last_write >= KEEPALIVE_SECS:
                        line({"type": "keepalive"})
                        last_write = now
                    continue
                last_write = now
                if kind in ("stdout", "stderr"):
                    line({"type": kind, "text": payload, "timestamp": time.time()})
                elif kind == "count":
                    line({"type": "number_of_executions", "execution_count": payload})
                elif kind == "result":
                    line({"type": "result", "is_main_result": payload["main"], "data": payload["data"]} if mime else e2b_result(payload["main"], payload["data"]))
                elif kind == "error":
                    line({"type": "error", **payload, **({"traceback": ANSI_RE.sub("", payload["traceback"])} if mime else {})})
            line({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-cell: interrupt it so the context is free for the next one.
            ctx.kernel.interrupt()
            for _ in cell:
                pass
            self.close_connection = True


# What the default Python context imports before it is first used: a notebook's usual first cell
# is fast then, and matplotlib's font cache is built once (at bake, on the template's disk) instead
# of by every sandbox's first plot, which takes a minute under TCG.
# Loaded, not bound: the user's namespace stays as a fresh kernel's.
PRELOAD = ("def _c_preload():\n"
           "    import importlib\n"
           "    for name in ('numpy', 'pandas', 'matplotlib.pyplot'):\n"
           "        try:\n"
           "            importlib.import_module(name)\n"
           "        except ImportError:\n"
           "            pass\n"
           "_c_preload()\n"
           "del _c_preload\n")


def dump_threads(signum=None, frame=None):
    """SIGUSR1: every thread's stack to the log (server.log), to see what a stuck cell waits on.
    A Python-level handler, run by the main thread with the GIL held. faulthandler's C-level dump
    reads other threads' frames while they run: in a CI run its dump stopped mid-line and the
    server was gone after it (its kernels said their parent had exited)."""
    import traceback
    names = {t.ident: t.name for t in threading.enumerate()}
    out = [f"--- {time.strftime('%H:%M:%S')} threads of the code server ---"]
    for ident, top in sys._current_frames().items():
        out.append(f"Thread {names.get(ident, '?')} ({ident}):")
        out.extend(line.rstrip("\n") for line in traceback.format_stack(top))
    print("\n".join(out), file=sys.stderr, flush=True)


def main():
    _set_busy(0)
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True
    langs = languages()
    if langs:
        ctx = default_context(langs[0])
        if ctx.language == "python":
            for _ in ctx.cell(PRELOAD, silent=True):
                pass
        # The spare the default context's start began, ready before the server says it is (at bake:
        # in the checkpoint, so that no sandbox of the template starts a kernel for its first new
        # context). That spare started beside the preload; on a loaded host it can miss its start
        # time, and a template baked without it made every new context start a kernel on the spot.
        # It is started again, now alone, before the server says it is ready.
        for _ in range(SPARE_START_ATTEMPTS):
            while True:
                with _spares_lock:
                    if _spares.get(ctx.language, "none") is not None:
                        break
                time.sleep(0.1)
            with _spares_lock:
                have = _spares.get(ctx.language) is not None
            if have or ctx.language != "python":
                break
            fill_spare(ctx.language)
    with open(os.path.join(STATE_DIR, "ready"), "w") as f:
        f.write(",".join(langs))
    server.serve_forever()


if __name__ == "__main__":
    random.seed()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, dump_threads)
    main()

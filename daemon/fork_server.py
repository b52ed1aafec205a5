# elasticrund's fork server (elasticrun --preload; daemon/fork_server.h starts it).
#
# Run as `PYTHON [the job's interpreter options] -c <this file> FD MODULE...`, FD being a
# Unix stream socket to the daemon. It imports the modules once, checks that it is
# still one thread, says Ready, then forks a child per Spawn request. The child becomes
# the worker (its own process group, death with this server, the worker's pipes on 1
# and 2, /dev/null on 0, its environment, directory and argv, the signal dispositions
# of a fresh interpreter) and runs the script as __main__ the way the interpreter
# would, so that the worker cannot tell, but for the modules it finds imported. The
# server reports each child's pid and, once it reaped it, its raw wait status.
#
# Messages: daemon/fork_protocol.h. Frames: common/frame.h. No docstring here: the
# first statement must see the namespace of a fresh __main__.
_PRISTINE = dict(globals())  # each worker's __main__ starts as this

import ctypes
import importlib
import importlib.machinery
import importlib.util
import io
import os
import select
import signal
import socket
import struct
import sys
import traceback
import types

_HEADER = struct.Struct("<HBBI")
_MAGIC, _VERSION, _MAX_PAYLOAD = 0x5245, 1, 16 << 20
SPAWN, READY, STARTED, REFUSED, EXITED, FAILED = range(1, 7)
SCRIPT, MODULE, CODE = range(3)
_FDS_PER_REQUEST = 2


def _shaping(env):
    """The entries that shape an interpreter at its start (options from PYTHON*, the
    locale its streams and file names are decoded with)."""
    return {k: v for k, v in env.items() if k.startswith(b"PYTHON") or k in (b"LANG", b"LC_ALL", b"LC_CTYPE")}


def _environ_of(entries):
    """KEY=VALUE byte strings as execve takes them: cut at a NUL, no key no entry, the
    last of a key wins."""
    env = {}
    for kv in entries:
        key, eq, value = kv.split(b"\0", 1)[0].partition(b"=")
        if eq and key:
            env[key] = value
    return env


def _dispositions():
    out = {}
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if handler is not None:
            out[sig] = handler
    return out


# What a fresh interpreter has before any code runs, and each worker starts from: the
# signal dispositions, the environment it was started with (/proc keeps that one), and
# the shaping entries after the interpreter's own changes (PEP 538 may set LC_CTYPE).
_SIGNALS = _dispositions()
with open("/proc/self/environ", "rb") as _f:
    _STARTED_WITH = _shaping(_environ_of(_f.read().split(b"\0")))
_SHAPED = _shaping(dict(os.environb))
_SERVER_PID = os.getpid()
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


class _Fatal(Exception):
    """The daemon broke the protocol: nothing more can be served."""


class _Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, n):
        if self.at + n > len(self.data):
            raise _Fatal("a request ends early")
        self.at += n
        return self.data[self.at - n:self.at]

    def u8(self):
        return self.take(1)[0]

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def bytes(self):
        return self.take(self.u32())

    def strings(self):
        return [self.bytes() for _ in range(self.u32())]


def _str(b):
    return struct.pack("<I", len(b)) + b


class Request:
    def __init__(self, payload, fds):
        r = _Reader(payload)
        self.id, self.mode = r.u64(), r.u8()
        self.target, self.args, self.argv, env, self.cwd = r.bytes(), r.strings(), r.strings(), r.strings(), r.bytes()
        if r.at != len(payload) or self.mode not in (SCRIPT, MODULE, CODE):
            raise _Fatal("a malformed request")
        self.env = _environ_of(env)
        self.out, self.err = fds

    def refusal(self):
        """Why this worker is not one to fork (the daemon then execs it), or None."""
        shaping = _shaping(self.env)
        if shaping != _STARTED_WITH:
            names = sorted(k.decode(errors="replace") for k in shaping.keys() ^ _STARTED_WITH.keys() |
                           {k for k in shaping.keys() & _STARTED_WITH.keys() if shaping[k] != _STARTED_WITH[k]})
            return f"its {', '.join(names)} differ from the fork server's, and shape an interpreter at its start"
        if self.mode != SCRIPT:
            return None
        # What the interpreter runs other than a source file (a directory or zip file
        # with __main__.py, compiled code), or what it reports on (a missing file), is
        # left to it.
        path = os.path.join(self.cwd if os.path.isdir(self.cwd) else os.getcwdb(), self.target)
        try:
            with open(path, "rb") as f:
                head = f.read(4)
        except OSError:
            return "its script cannot be opened here: the interpreter says why"
        if path.endswith(b".pyc") or head[:2] == importlib.util.MAGIC_NUMBER[:2]:
            return "its script is compiled code"
        try:
            import zipimport
            zipimport.zipimporter(os.fsdecode(path))
            return "its script is a zip application"
        except Exception:
            return None


class Server:
    def __init__(self, sock):
        self.sock, self.buf, self.fds = sock, bytearray(), []
        self.poll = select.epoll()
        self.poll.register(sock.fileno(), select.EPOLLIN)
        self.children = {}  # pidfd -> pid

    def send(self, kind, payload=b""):
        self.sock.sendall(_HEADER.pack(_MAGIC, kind, _VERSION, len(payload)) + payload)

    def prepare(self, modules):
        """Imports the modules; why the server cannot serve, or None."""
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException as e:
                return f"importing {name} failed: {traceback.format_exception_only(type(e), e)[-1].strip()}"
        # A fork copies the forking thread only: a lock another thread held would stay
        # held in every worker. A module that starts threads at import cannot be preloaded.
        tasks = os.listdir("/proc/self/task")
        if len(tasks) > 1:
            names = []
            for t in tasks:
                try:
                    with open(f"/proc/self/task/{t}/comm") as f:
                        names.append(f.read().strip())
                except OSError:
                    pass
            return (f"after importing {', '.join(modules)} it runs {len(tasks)} threads ({', '.join(names)}); "
                    f"forking a process with threads is unsafe")
        try:
            os.close(os.pidfd_open(os.getpid()))
        except (AttributeError, OSError) as e:
            return f"it cannot watch its children: pidfd_open: {e}"
        # Exit statuses are ours to collect, whatever an import did to SIGCHLD.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        return None

    def serve(self):
        """Serves until a child is forked, which returns its Request (in the child);
        None in the server once the daemon has gone."""
        while True:
            for fd, _ in self.poll.poll():
                if fd != self.sock.fileno():
                    self.reap(fd)
                    continue
                if not self.receive():
                    return None
                while (req := self.next_request()) is not None:
                    if self.spawn(req):
                        return req

    def receive(self):
        data, ancillary, flags, _ = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(4 * 4 * _FDS_PER_REQUEST),
                                                      socket.MSG_CMSG_CLOEXEC)
        for level, kind, blob in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                self.fds += struct.unpack(f"{len(blob) // 4}i", blob[:len(blob) // 4 * 4])
        if flags & socket.MSG_CTRUNC:
            raise _Fatal("the descriptors of a request were cut off")
        self.buf += data
        return bool(data)

    def next_request(self):
        if len(self.buf) < _HEADER.size:
            return None
        magic, kind, version, n = _HEADER.unpack_from(self.buf)
        if magic != _MAGIC or version != _VERSION or n > _MAX_PAYLOAD or kind != SPAWN:
            raise _Fatal(f"not a spawn request (type {kind})")
        if len(self.buf) < _HEADER.size + n:
            return None
        if len(self.fds) < _FDS_PER_REQUEST:
            raise _Fatal("a request came without its descriptors")
        payload = bytes(self.buf[_HEADER.size:_HEADER.size + n])
        del self.buf[:_HEADER.size + n]
        fds, self.fds = self.fds[:_FDS_PER_REQUEST], self.fds[_FDS_PER_REQUEST:]
        return Request(payload, fds)

    def spawn(self, req):
        """Forks the worker: True in the child, False here (started or refused)."""
        why = req.refusal()
        pid = None
        if why is None:
            for f in (sys.stdout, sys.stderr):  # what was written here must not be written again there
                try:
                    f.flush()
                except (OSError, ValueError):
                    pass
            try:
                pid = os.fork()
            except OSError as e:
                why = f"fork failed: {e}"
        if pid == 0:
            self.leave()
            return True
        os.close(req.out)
        os.close(req.err)
        if pid is not None:
            why = self.watch(pid)
        if why is None:
            self.send(STARTED, struct.pack("<QI", req.id, pid))
        else:
            self.send(REFUSED, struct.pack("<Q", req.id) + _str(why.encode()))
        return False

    def watch(self, pid):
        # Both sides make the group, so that the daemon's first signal finds it.
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as e:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"cannot watch the child: pidfd_open: {e}"
        self.poll.register(pidfd, select.EPOLLIN)
        self.children[pidfd] = pid
        return None

    def reap(self, pidfd):
        pid = self.children.pop(pidfd)
        self.poll.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        self.send(EXITED, struct.pack("<Ii", pid, status))

    def leave(self):
        """In the child: nothing of the server's stays open."""
        self.poll.close()
        for fd in [*self.children, *self.fds]:
            os.close(fd)
        self.sock.close()


def _retitle(argv):
    """Writes the worker's argv over ours in place (as setproctitle does), so that
    /proc/PID/cmdline, ps and pgrep show the worker's command, not the server's."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # fields 48 and 49: arg_start, arg_end
    title = b"\0".join(argv)[:end - start - 1]
    ctypes.memmove(start, title + b"\0" * (end - start - len(title)), end - start)


def _become(req):
    """Makes this forked child the worker's process, as an exec of the interpreter would."""
    os.setpgid(0, 0)
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != _SERVER_PID:
        os._exit(1)  # the server died before prctl: nobody to die with
    for sig, handler in _SIGNALS.items():
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError, TypeError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    null = os.open(os.devnull, os.O_RDWR)
    for fd, to in ((null, 0), (req.out, 1), (req.err, 2)):
        os.dup2(fd, to)
    for fd in (null, req.out, req.err):
        os.close(fd)
    # The whole environment, in os.environ and in the C library's (an import may have
    # set entries there that os.environ never saw); then the interpreter's own changes
    # at start, which a fresh one would make from the same shaping entries.
    os.environ.clear()
    _LIBC.clearenv()
    for key, value in {**req.env, **_SHAPED}.items():
        os.environb[key] = value
    for key in _shaping(req.env).keys() - _SHAPED.keys():
        del os.environb[key]
    try:
        os.chdir(req.cwd)
    except OSError:
        pass  # as the process launcher: a directory missing on this host leaves the worker in ours
    _retitle(req.argv)
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = [os.fsdecode(a) for a in req.argv]
    _thread_settings()


def _thread_settings():
    """Settings a fresh process's libraries read from the environment when they load,
    which they did in the server."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    # The legacy global generator was seeded at import: every fork would draw the same numbers.
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def _fresh_main():
    main = types.ModuleType("__main__")
    main.__dict__.clear()
    main.__dict__.update(_PRISTINE, __annotations__={})
    sys.modules["__main__"] = main
    return main


def _run(req):
    """Runs the worker's script, module or code as the interpreter's main would."""
    main = _fresh_main()
    target, args = os.fsdecode(req.target), [os.fsdecode(a) for a in req.args]
    if req.mode == SCRIPT:
        path = os.path.abspath(target) if sys.version_info >= (3, 9) else target  # __main__.__file__
        first = os.path.dirname(os.path.realpath(path))
    else:
        first = os.getcwd() if req.mode == MODULE else ""
    # sys.path[0] is the script's directory, the current one for -m, '' for -c.
    if not getattr(sys.flags, "safe_path", False) and "" in sys.path:
        sys.path[sys.path.index("")] = first
    importlib.invalidate_caches()
    if req.mode == SCRIPT:
        sys.argv = [target, *args]
        with io.open_code(path) as f:
            source = f.read()
        main.__dict__.update(__file__=path, __cached__=None,
                             __loader__=importlib.machinery.SourceFileLoader("__main__", path))
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    elif req.mode == MODULE:
        import runpy
        sys.argv = ["-m", *args]
        runpy._run_module_as_main(target)
    else:
        sys.argv = ["-c", *args]
        exec(compile(target, "<string>", "exec", dont_inherit=True), main.__dict__)


def _without_server_frames(tb):
    while tb is not None and tb.tb_frame.f_globals is globals():
        tb = tb.tb_next
    return tb


def _print_uncaught(e):
    """What the interpreter does with an exception nothing caught: sys.last_*, then
    sys.excepthook, with the traceback starting at the worker's own first frame."""
    tb = _without_server_frames(e.__traceback__)
    e.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = e
    hook = getattr(sys, "excepthook", None)
    if hook is None:
        print("sys.excepthook is missing", file=sys.stderr)
        traceback.print_exception(type(e), e, tb)
        return
    try:
        hook(type(e), e, tb)
    except BaseException as failed:
        print("Error in sys.excepthook:", file=sys.stderr)
        traceback.print_exception(type(failed), failed, failed.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        traceback.print_exception(type(e), e, tb)


def _die_by_sigint():
    """After an uncaught KeyboardInterrupt the interpreter finishes (threads, atexit,
    its streams), then kills itself with SIGINT, so that its parent sees the signal."""
    import atexit
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError, AttributeError):
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(128 + signal.SIGINT)


def _worker(req):
    """The forked child's life: its exit status is the script's, as the interpreter's
    would be. A SystemExit goes up to the interpreter, which handles it as for any
    script; anything else uncaught is printed as it would print it, then exit 1."""
    _become(req)
    try:
        _run(req)
    except SystemExit:
        raise
    except BaseException as e:
        _print_uncaught(e)
        if isinstance(e, KeyboardInterrupt):
            _die_by_sigint()
        raise SystemExit(1) from None


def _main():
    fd, modules = int(sys.argv[1]), sys.argv[2:]
    server = Server(socket.socket(fileno=fd))
    why = server.prepare(modules)
    if why is not None:
        server.send(FAILED, _str(why.encode()))
        return None
    try:
        server.send(READY)
        return server.serve()
    except _Fatal as e:
        server.send(FAILED, _str(str(e).encode()))
    except OSError:
        pass  # the daemon is gone; so are we, and our children with us
    return None


_request = _main()
if _request is not None:
    _worker(_request)

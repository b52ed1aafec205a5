"""What the check workers share: counted checks that print `FAIL ...` lines, an
expected-exception check, and the closing line `<tag>: OK <n> checks` (exit 1 on any
failure), which the tests parse and hold to a minimum count."""
import sys

failures = []
checks = 0


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print("FAIL", what, flush=True)


def raises(kind, fn, what, text=None):
    """Checks that fn() raises `kind` whose message contains `text`."""
    try:
        fn()
    except kind as e:
        check(text is None or text in str(e), f"{what}: message {e!r} lacks {text!r}")
        return
    except Exception as e:  # noqa: BLE001 - the wrong kind is the failure reported
        check(False, f"{what}: raised {type(e).__name__}: {e}, not {kind.__name__}")
        return
    check(False, f"{what}: did not raise {kind.__name__}")


def finish(tag):
    """The closing line; exits 1 when a check failed."""
    if failures:
        print(f"{tag}: {len(failures)} of {checks} checks FAILED", flush=True)
        sys.exit(1)
    print(f"{tag}: OK {checks} checks", flush=True)

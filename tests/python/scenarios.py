"""Workloads of tests/python/scenarios.rs, each ending in leaf_work.

`python scenarios.py drive SECONDS`: wait for a line on stdin, then run
every scenario in turn, each in its own thread for SECONDS, printing
`FUNCTION TID` (the thread's id as the kernel numbers it) for each thread
that runs a scenario's root function.
`python scenarios.py main SECONDS`: run the method chain from the module's
top level, on the main thread, at once, for SECONDS (the modules the
other scenarios need are imported where they are used, so that the chain
starts with the script).
"""
import sys
import time


def leaf_work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def recurse(depth):
    if depth > 1:
        return recurse(depth - 1)  # recurse: call
    return leaf_work(20000)  # recurse: leaf


def run_recursion(end):
    while time.time() < end:
        recurse(50)  # run_recursion: call


class Shape:
    def area(self, n):
        return (lambda k: self.measure(k))(n)  # Shape.area: call

    def measure(self, n):
        return leaf_work(n)  # Shape.measure: call


def run_methods(end):
    while time.time() < end:
        Shape().area(20000)  # run_methods: call


def squares(n):
    while True:
        yield leaf_work(n)  # squares: call


def run_generator(end):
    for _ in squares(20000):  # run_generator: call
        if time.time() >= end:
            break


async def compute(n):
    return leaf_work(n)  # compute: call


async def amain(end):
    import asyncio

    while time.time() < end:
        for _ in range(10):
            await compute(20000)  # amain: call
        await asyncio.sleep(0)


def run_async(end):
    import asyncio

    asyncio.run(amain(end))  # run_async: call


def sort_key(x):
    return leaf_work(20000 + x)  # sort_key: call


def run_sorted(end):
    while time.time() < end:
        sorted(range(20), key=sort_key)  # run_sorted: call


def map_fn(x):
    return leaf_work(20000 + x)  # map_fn: call


def run_map(end):
    while time.time() < end:
        list(map(map_fn, range(20)))  # run_map: call


def thread_a(end):
    while time.time() < end:
        leaf_work(20000)  # thread_a: call


def thread_b(end):
    while time.time() < end:
        leaf_work(20000)  # thread_b: call


def thread_c(end):
    while time.time() < end:
        leaf_work(20000)  # thread_c: call


def in_thread(function, end):
    import threading

    thread = threading.Thread(target=function, args=(end,))
    thread.start()
    print(function.__name__, thread.native_id, flush=True)
    return thread


def run_threads(end):
    for thread in [in_thread(f, end) for f in (thread_a, thread_b, thread_c)]:
        thread.join()


SCENARIOS = [run_recursion, run_methods, run_generator, run_async, run_sorted, run_map]

if sys.argv[1] == "drive":
    import asyncio, threading  # noqa: E401,F401 (imported before the scenarios run)

    seconds = float(sys.argv[2])
    sys.stdin.readline()
    for scenario in SCENARIOS:
        in_thread(scenario, time.time() + seconds).join()
    run_threads(time.time() + seconds)
else:
    run_methods(time.time() + float(sys.argv[2]))  # <module>: call

#!/usr/bin/env python3
"""Locked read-modify-write instructions per request in a server run.

Usage: bench/lock_ops.py CALLGRIND_FILE BINARY INSTRUCTIONS_PER_REQUEST

CALLGRIND_FILE is a dump of `bench/http_load.sh` kept with
`CALLGRIND=1 CALLGRIND_KEEP=<dir> CALLGRIND_ARGS="--dump-instr=yes
--compress-pos=no --compress-strings=no"`; BINARY is the server it ran
(`target/release/examples/webhook_server`); INSTRUCTIONS_PER_REQUEST is
the figure the script printed for that run (it gives the request count).
Counts the executions of the binary's `lock`-prefixed and `xchg`
instructions (found with objdump), per request, in all and by symbol.
glibc's own (its allocator's arena locks) are not counted.
"""
import bisect
import collections
import os
import re
import signal
import subprocess
import sys


def main():
    # Quietly stop when the output is cut short (`| head`).
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    dump, binary, per_request = sys.argv[1], sys.argv[2], float(sys.argv[3])
    disassembly = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True, text=True
    ).stdout
    locked = set()
    for line in disassembly.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\t(lock |xchg)", line)
        if m:
            locked.add(int(m.group(1), 16))
    symbols = []
    for line in subprocess.run(
        ["nm", "-n", "-C", binary], capture_output=True, text=True
    ).stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] and parts[1] in "tTwW":
            symbols.append((int(parts[0], 16), parts[2]))
    starts = [s for s, _ in symbols]
    total_instructions = None
    by_symbol = collections.Counter()
    in_binary = False
    after_call = False
    name = os.path.basename(binary)
    for line in open(dump, errors="replace"):
        if line.startswith(("summary:", "totals:")):
            total_instructions = int(line.split()[1])
        elif line.startswith("ob="):
            in_binary = name in line
        elif line.startswith("calls="):
            after_call = True
        elif line.startswith("0x"):
            if after_call:
                # The inclusive cost of a call, not an execution.
                after_call = False
                continue
            fields = line.split()
            address = int(fields[0], 16)
            if in_binary and address in locked:
                symbol = symbols[bisect.bisect_right(starts, address) - 1][1]
                by_symbol[symbol] += int(fields[-1])
    requests = total_instructions / per_request
    print(f"locked instructions per request: {sum(by_symbol.values()) / requests:.2f}")
    for symbol, n in by_symbol.most_common(25):
        print(f"{n / requests:6.2f}  {symbol[:160]}")


if __name__ == "__main__":
    main()

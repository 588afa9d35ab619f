# Prints glibc's fast bins (chunks per bin, 32 bytes and up by 16) at every
# call of malloc_consolidate in a running server, to see which chunk sizes
# overflow the per-thread cache. Needs glibc's debug symbols (Debian ships
# them for libc6 here). Use on a server under load, e.g.:
#   timeout 8 gdb -q -p <pid> -x bench/malloc_fastbins.gdb -batch -ex continue \
#     | grep '^bins' | sort | uniq -c | sort -rn
set pagination off
break malloc_consolidate
commands
silent
set $i = 0
printf "bins:"
while $i < 7
  set $p = av->fastbinsY[$i]
  set $n = 0
  while $p != 0 && $n < 50
    set $n = $n + 1
    # Safe-linking: the next pointer is stored xor-ed with its own address >> 12.
    set $p = (mchunkptr) ((((unsigned long)&$p->fd) >> 12) ^ ((unsigned long)$p->fd))
  end
  printf " %d", $n
  set $i = $i + 1
end
printf "\n"
continue
end

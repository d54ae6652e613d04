"""The machine a command runs on:

- `device`: the `auto` device, memory checks, out-of-memory messages;
- `cpus`: the CPU cores this process may use (affinity, cgroup quota);
- `progress`: progress bars.

Import the submodules directly; nothing is imported here."""

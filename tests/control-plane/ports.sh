# Sourced by the start scripts: free loopback ports.
#
# free_port VAR sets VAR to a port the kernel hands out for a bind to 127.0.0.1:0, never the
# same one twice in one script run (it sets a variable instead of printing, because a command
# substitution would run in a subshell and forget the ports already handed out).
used_ports=" "
free_port() {
  local port
  for _ in $(seq 1 50); do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    if [[ $used_ports != *" $port "* ]]; then
      used_ports+="$port "
      printf -v "$1" '%s' "$port"
      return 0
    fi
  done
  echo "no free loopback port found" >&2
  return 1
}

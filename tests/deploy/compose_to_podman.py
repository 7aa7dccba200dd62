"""Turns the `docker-compose config` rendering of deploy/docker/compose.yaml into `podman run`
argument lists, so tests/deploy/image_run_test.sh starts the services with compose's own command
lines, volumes, secrets, ports and network addresses (podman 4.3 has no compose of its own).

  compose_to_podman.py CONFIG.yaml PROJECT [--cpu] [--host-network PORT_BASE]

Prints one line per service (coordinator first, then the others in file order): the service name,
a tab, and a JSON array of the arguments after `podman run -d`. Also a first line
"network<TAB>SUBNET" (absent with --host-network).

--cpu             CPU workers from the GPU file: `--device=cuda:N` becomes `--device=cpu` and the
                  GPU reservation (deploy.resources) is dropped; nothing else changes.
--host-network P  where the host cannot give containers a network of their own: every service
                  on the host's, each fixed address of the file becomes 127.0.0.1 with a port of
                  its own from P up, and `coordinator` in an endpoint becomes 127.0.0.1.
"""
import json
import re
import sys

import yaml


def main(argv):
    config_path, project = argv[1], argv[2]
    cpu = "--cpu" in argv
    host_port = int(argv[argv.index("--host-network") + 1]) if "--host-network" in argv else 0
    config = yaml.safe_load(open(config_path))
    services = config["services"]
    order = ["coordinator"] + [n for n in services if n != "coordinator"]

    # Host networking: each (address, port) of the file gets a loopback port of its own.
    remap = {}

    def local(addr, port):
        if (addr, port) not in remap:
            remap[(addr, port)] = host_port + len(remap)
        return remap[(addr, port)]

    coordinator_port = None
    if host_port:
        coordinator_port = local("coordinator", "5555")

    def endpoint(arg):
        if not host_port:
            return arg
        def sub(m):
            addr, port = m.group(1), m.group(2)
            if addr in ("coordinator", "0.0.0.0"):
                return "tcp://127.0.0.1:%d" % coordinator_port
            return "tcp://127.0.0.1:%d" % local(addr, port)
        return re.sub(r"tcp://([^:/]+):(\d+)", sub, arg)

    networks = config.get("networks", {})
    if not host_port:
        for name, net in networks.items():
            subnet = net["ipam"]["config"][0]["subnet"]
            print("network\t%s" % subnet)
            break
    coordinator_ip = None
    for net in services["coordinator"].get("networks", {}).values():
        coordinator_ip = (net or {}).get("ipv4_address")

    for name in order:
        svc = services[name]
        args = ["--name", "%s-%s" % (project, name)]
        if svc.get("restart"):
            args += ["--restart", svc["restart"]]
        for volume in svc.get("volumes", []):
            if isinstance(volume, dict):  # long syntax
                source, target = volume["source"], volume["target"]
                mode = "ro" if volume.get("read_only") else "rw"
            else:
                parts = volume.split(":")
                source, target = parts[0], parts[1]
                mode = parts[2] if len(parts) > 2 else "rw"
            if not source.startswith("/"):
                source = "%s-%s" % (project, source)  # a named volume of this project
            args += ["-v", "%s:%s:%s" % (source, target, mode)]
        for secret in svc.get("secrets", []):
            source = secret["source"] if isinstance(secret, dict) else secret
            target = (secret.get("target") if isinstance(secret, dict) else None) or source
            args += ["-v", "%s:/run/secrets/%s:ro" % (config["secrets"][source]["file"], target)]
        if host_port:
            args += ["--network", "host"]
        else:
            for net_name, net in svc.get("networks", {}).items():
                args += ["--network", "%s-%s" % (project, net_name)]
                if net and net.get("ipv4_address"):
                    args += ["--ip", net["ipv4_address"]]
            if coordinator_ip and name != "coordinator":
                args += ["--add-host", "coordinator:%s" % coordinator_ip]  # compose's service-name DNS
            for port in svc.get("ports", []):
                if isinstance(port, dict):
                    host_ip = port.get("host_ip")
                    spec = "%s:%s" % (port["published"], port["target"])
                    args += ["-p", (host_ip + ":" if host_ip else "") + spec + "/" + port.get("protocol", "tcp")]
                else:
                    args += ["-p", str(port)]
        command = svc.get("command", [])
        if isinstance(command, str):
            command = command.split()
        out = []
        for arg in command:
            if cpu and arg.startswith("--device=cuda"):
                arg = "--device=cpu"
            out.append(endpoint(arg))
        args += [svc["image"]] + out
        print("%s\t%s" % (name, json.dumps(args)))


if __name__ == "__main__":
    main(sys.argv)

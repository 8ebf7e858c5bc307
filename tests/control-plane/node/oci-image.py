#!/usr/bin/env python3
"""Writes a single-layer OCI image archive (an OCI image layout in a tar), offline.

The node flavour imports its images with `ctr images import` instead of pulling them: the
sandbox (pause) image and lazyquota's image. An image here is a handful of files, so a small
script with Python's standard library does it; the archive is reproducible (fixed mtimes,
sorted entries, uid/gid 0).

    oci-image.py --name docker.io/library/lazyquota:0.1.0 --out image.tar \
        --file /path/to/lazyquota:/lazyquota:0755 --entrypoint /lazyquota --cmd run \
        --user 65532 [--passwd] [--label k=v]...

--file SRC:DEST[:MODE] adds a regular file (following symlinks); parent directories are made.
--passwd adds /etc/passwd, /etc/group and /tmp as distroless does (root and nonroot 65532).
"""

import argparse
import hashlib
import io
import json
import os
import tarfile

EPOCH = 0


def add_dir(tar, seen, path, mode=0o755):
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d and d not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = mode if i == len(parts) else 0o755
            info.mtime = EPOCH
            tar.addfile(info)


def add_bytes(tar, seen, path, data, mode):
    add_dir(tar, seen, os.path.dirname(path))
    info = tarfile.TarInfo(path.lstrip("/"))
    info.size = len(data)
    info.mode = mode
    info.mtime = EPOCH
    tar.addfile(info, io.BytesIO(data))


def layer(files, passwd):
    buf = io.BytesIO()
    seen = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = []
        for spec in files:
            src, dest, *mode = spec.split(":")
            with open(src, "rb") as f:
                entries.append((dest, f.read(), int(mode[0], 8) if mode else 0o644))
        if passwd:
            entries.append(("/etc/passwd", b"root:x:0:0:root:/root:/sbin/nologin\n"
                            b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n", 0o644))
            entries.append(("/etc/group", b"root:x:0:\nnonroot:x:65532:\n", 0o644))
            add_dir(tar, seen, "/tmp", 0o1777)
            add_dir(tar, seen, "/home/nonroot", 0o700)
        for dest, data, mode in sorted(entries):
            add_bytes(tar, seen, dest, data, mode)
    return buf.getvalue()


def blob(tar, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mode = 0o644
    info.mtime = EPOCH
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="image reference, e.g. docker.io/library/x:tag")
    p.add_argument("--out", required=True)
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--entrypoint", action="append", default=[])
    p.add_argument("--cmd", action="append", default=[])
    p.add_argument("--user", default="")
    p.add_argument("--passwd", action="store_true")
    p.add_argument("--label", action="append", default=[])
    p.add_argument("--expose", action="append", default=[])
    a = p.parse_args()

    layer_tar = layer(a.file, a.passwd)
    diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": a.user,
            "Entrypoint": a.entrypoint,
            "Cmd": a.cmd,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Labels": dict(l.split("=", 1) for l in a.label),
            "ExposedPorts": {f"{port}/tcp": {} for port in a.expose},
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tests/control-plane/node/oci-image.py"}],
    }
    with tarfile.open(a.out, "w", format=tarfile.PAX_FORMAT) as tar:
        cfg = blob(tar, json.dumps(config, sort_keys=True).encode())
        lyr = blob(tar, layer_tar)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **lyr}],
        }
        man = blob(tar, json.dumps(manifest, sort_keys=True).encode())
        tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **man,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": a.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        }
        for name, data in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            raw = json.dumps(data, sort_keys=True).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            info.mode = 0o644
            info.mtime = EPOCH
            tar.addfile(info, io.BytesIO(raw))
    print(f"{a.name} {man['digest']} ({len(layer_tar)} bytes uncompressed)")


if __name__ == "__main__":
    main()

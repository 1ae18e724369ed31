"""A real single-node Kubernetes for this machine, built from source (see docs/localkube-build.md).

`localkube.build` builds and caches the binaries; `localkube.versions` pins what they are.
"""

"""A real single-node Kubernetes for this machine, built from source (see docs/localkube-build.md
and docs/adr/0005-local-cluster.md).

`versions` pins what runs and `build` compiles it (`gomod` writes its wrapper modules).
`images` says which images there are and what each is built from (`context` selects a build
context); `docker` builds them and loads them into a cluster's runtime. `cluster` starts and
stops the cluster: `components` holds the command lines and config files, `addons` the
manifests, `pki` the certificates, `host` what it changes on the machine outside its own
directories, `processes` the detached processes and their pid files, `config` the paths and
addresses they all agree on.
"""

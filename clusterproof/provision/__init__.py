"""Obtaining what the harness runs: upstream binaries built from their Go modules, the real nodes' container
images, pinned Debian host packages (running them is ``clusterproof.cluster``)."""

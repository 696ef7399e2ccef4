"""`primus prepare <extra>`: install a backend's pinned stack, keeping the installed torch."""

"""The kernel: hooks, kinds, registries, plugins, params, capabilities, binding, errors, contracts."""

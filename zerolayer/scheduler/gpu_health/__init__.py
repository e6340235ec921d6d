"""GPU health: NVML events, polled signals, Xid classification and the reaction to them."""

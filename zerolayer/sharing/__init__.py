"""Memory shared between layer processes: mapped files, CUDA VMM and IPC, fd passing."""

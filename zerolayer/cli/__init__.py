"""The ``zerolayer`` command line: run the stack, one layer, a client call or a tool."""

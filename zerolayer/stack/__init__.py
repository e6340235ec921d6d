"""Running the four layers of one deployment on this machine: settings, pre-flight, launcher."""

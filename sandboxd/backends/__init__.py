"""Where sandboxes run (docker, fake) behind one small port: sandboxd.backends.base."""

module sandboxd.dev/sandboxd-runc

go 1.22

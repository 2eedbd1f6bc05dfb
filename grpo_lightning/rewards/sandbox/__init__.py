"""Running untrusted code for rewards: the sandbox, its command and the assert-test runner."""

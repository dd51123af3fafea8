"""`python -m bitcompile`: prebuild the kernels for this machine and report what was built."""

from bitcompile._build import main

main()

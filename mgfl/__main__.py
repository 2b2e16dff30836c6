from mgfl.cli import main

main()

from raas.cli import main

main()

import pytest
from ledger.account import Account, InsufficientFunds


def test_deposit():
    a = Account()
    a.deposit(5)
    assert a.balance == 5


def test_overdraft():
    a = Account(100)
    with pytest.raises(InsufficientFunds):
        a.withdraw(150)
    assert a.balance == 100

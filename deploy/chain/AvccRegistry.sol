// SPDX-License-Identifier: UNLICENSED
pragma solidity 0.8.26;

/// @title AVCC copyright registry: notarises reviewed works and settlement instructions.
/// @notice A work is registered once: a second registration of the same record id or of the
/// same content hash is refused by the contract itself, so a retried or replayed submission can
/// never create a second registration. Only the owner (the chain-svc signing key) writes.
contract AvccRegistry {
    struct Work {
        bytes32 contentHash;
        bytes32 reportHash;
        uint8 level;
        uint64 blockNumber;
    }

    struct Settlement {
        uint64 recordId;
        bytes32 instructionHash;
        uint64 blockNumber;
    }

    address public immutable owner;
    uint256 public workCount;
    uint256 public settlementCount;

    mapping(uint64 => Work) private works;
    mapping(bytes32 => uint64) private recordOfContent;
    mapping(bytes32 => Settlement) private settlements;

    event WorkRegistered(
        uint64 indexed recordId, bytes32 indexed contentHash, bytes32 reportHash, uint8 level
    );
    event SettlementRecorded(
        bytes32 indexed settlementKey, uint64 indexed recordId, bytes32 instructionHash
    );

    error NotOwner(address sender);
    error RecordAlreadyRegistered(uint64 recordId);
    error ContentAlreadyRegistered(bytes32 contentHash, uint64 recordId);
    error SettlementAlreadyRecorded(bytes32 settlementKey);
    error InvalidRegistration();

    constructor() {
        owner = msg.sender;
    }

    modifier onlyOwner() {
        if (msg.sender != owner) revert NotOwner(msg.sender);
        _;
    }

    /// @notice Register a reviewed work once (record id and content hash are both unique).
    function registerWork(uint64 recordId, bytes32 contentHash, bytes32 reportHash, uint8 level)
        external
        onlyOwner
    {
        if (recordId == 0 || contentHash == bytes32(0)) revert InvalidRegistration();
        if (works[recordId].blockNumber != 0) revert RecordAlreadyRegistered(recordId);
        uint64 holder = recordOfContent[contentHash];
        if (holder != 0) revert ContentAlreadyRegistered(contentHash, holder);
        works[recordId] = Work(contentHash, reportHash, level, uint64(block.number));
        recordOfContent[contentHash] = recordId;
        workCount += 1;
        emit WorkRegistered(recordId, contentHash, reportHash, level);
    }

    /// @notice Record a settlement instruction once per settlement key.
    function recordSettlement(bytes32 settlementKey, uint64 recordId, bytes32 instructionHash)
        external
        onlyOwner
    {
        if (settlementKey == bytes32(0)) revert InvalidRegistration();
        if (settlements[settlementKey].blockNumber != 0) revert SettlementAlreadyRecorded(settlementKey);
        settlements[settlementKey] = Settlement(recordId, instructionHash, uint64(block.number));
        settlementCount += 1;
        emit SettlementRecorded(settlementKey, recordId, instructionHash);
    }

    /// @notice The registration of a record (blockNumber 0 = not registered).
    function registration(uint64 recordId)
        external
        view
        returns (bytes32 contentHash, bytes32 reportHash, uint8 level, uint64 blockNumber)
    {
        Work storage work = works[recordId];
        return (work.contentHash, work.reportHash, work.level, work.blockNumber);
    }

    /// @notice The record holding a content hash (0 = none).
    function recordOf(bytes32 contentHash) external view returns (uint64) {
        return recordOfContent[contentHash];
    }

    /// @notice A recorded settlement instruction (blockNumber 0 = not recorded).
    function settlement(bytes32 settlementKey)
        external
        view
        returns (uint64 recordId, bytes32 instructionHash, uint64 blockNumber)
    {
        Settlement storage s = settlements[settlementKey];
        return (s.recordId, s.instructionHash, s.blockNumber);
    }
}
